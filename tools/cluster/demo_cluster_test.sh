#!/usr/bin/env bash
# The cluster demo for three steps on 2 trainer ranks and 2 rollout replicas, each on a host
# (network namespace) of its own: the job succeeds with both ranks training, the ranks' and
# replicas' links carried bytes, and no namespace of the run outlives it; then again with the
# replicas relaying adapter versions along a chain. Needs root and the
# machine's namespaces, hence tag "local" in BUILD.bazel.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
work="$TEST_TMPDIR/demo_cluster"
mkdir -p "$work"
"$root/engine/make_base_model" --digits=1 --max_steps=100 --out="$work/base.safetensors" >/dev/null
python3 "$root/tools/cluster/demo_cluster.py" --bin="$root" --job="$root/jobs/demo.yaml" \
  --base_model="$work/base.safetensors" --out="$work/run" --trainer_ranks=2 --rollouts=2 \
  --steps=3 | tee "$work/output.txt"
grep -q "3/3 SUCCEEDED .* 2 ranks" "$work/output.txt" || { echo "the job did not succeed on 2 ranks"; exit 1; }
# Every host's link carried bytes during the job (awk: columns host, sent MB, received MB).
awk '/^(trainer|rollout|weightstore|routerreplay)[0-9]* / { if ($2 + $3 <= 0) { print $1 " carried nothing"; bad = 1 } }
     END { exit bad }' "$work/output.txt"
grep -q "collective bytes per step from rank 0: 0.[0-9]*[1-9]" "$work/output.txt" ||
  { echo "no collective bytes"; exit 1; }
expect_namespaces_removed() {
  local run
  run=$(sed -n 's/.*network namespaces (\(tdm[0-9]*\)-\*).*/\1/p' "$1")
  [[ -n $run ]] || { echo "the run named no namespaces"; exit 1; }
  if ip netns list | grep -q "^$run-"; then
    echo "namespaces of $run left behind"; exit 1
  fi
}
expect_namespaces_removed "$work/output.txt"
# Again with the replicas in a relay chain: the second reads every version from the first.
python3 "$root/tools/cluster/demo_cluster.py" --bin="$root" --job="$root/jobs/demo.yaml" \
  --base_model="$work/base.safetensors" --out="$work/relayed" --trainer_ranks=2 --rollouts=2 \
  --relay_rollouts --steps=3 | tee "$work/relayed.txt"
grep -q "3/3 SUCCEEDED" "$work/relayed.txt" || { echo "the relayed job did not succeed"; exit 1; }
grep -Eq "rollout1 store 0 relay [1-9]" "$work/relayed.txt" ||
  { echo "rollout1 did not read its versions from rollout0"; exit 1; }
expect_namespaces_removed "$work/relayed.txt"
echo "demo_cluster_test: passed"
