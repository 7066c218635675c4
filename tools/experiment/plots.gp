# The plots of `./tandem experiment`: per step, the reward, the rollout-trainer k3 KL and the
# routing disagreement of every run, bf16 rollout on the left and FP8 on the right, from each
# run's DIR/<precision>-<replay>-<correction>.tsv (tandem-cli --metrics_tsv: StepMetrics fields).
#   gnuplot -e "dir='.tandem/experiment'" tools/experiment/plots.gp
replays = "OFF R2 R3"
corrections = "NONE TOKEN_TIS ICEPOP"
outputs = "reward k3 disagreement"
fields = "reward_mean mismatch_kl_k3 routing_disagreement_token_layer"
titles = "reward|rollout-trainer k3 KL|routing disagreement, token x layer"
set terminal pngcairo size 1400,520 noenhanced
set datafile separator "\t"
set datafile columnheaders
set key outside right
set xlabel "step"
set grid
do for [m = 1:3] {
  set output sprintf("%s/%s.png", dir, word(outputs, m))
  if (m == 2) { set logscale y } else { unset logscale y }
  set multiplot layout 1, 2
  do for [precision in "bf16 fp8"] {
    set title sprintf("%s, %s rollout", system(sprintf("echo '%s' | cut -d'|' -f%d", titles, m)), precision)
    # Colour: the IS correction; dashes: the replay mode (R2 draws over OFF when they agree).
    plot for [r = 1:3] for [c = 1:3] \
      sprintf("%s/%s-%s-%s.tsv", dir, precision, word(replays, r), word(corrections, c)) \
      using "step":(column(word(fields, m))) with lines linecolor c dashtype r linewidth 1.5 \
      title sprintf("%s %s", word(replays, r), word(corrections, c))
  }
  unset multiplot
}
