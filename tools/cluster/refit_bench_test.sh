#!/usr/bin/env bash
# refit_bench.py on a small cluster: 2 trainer ranks publish their shards of three versions, two
# replicas fetch each one over shaped links, the figures are printed, and no namespace of the
# run outlives it. Needs root and the machine's namespaces, hence tag "local" in BUILD.bazel.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
python3 "$root/tools/cluster/refit_bench.py" --bin="$root" --ranks=2 --replicas=2 --rate=1gbit \
  --mib=2 --versions=3 --out="$TEST_TMPDIR/refit" | tee "$TEST_TMPDIR/output.txt"
grep -Eq "2 replicas, every one from the store: refit [0-9.]+-[0-9.]+ s = [0-9.]+-[0-9.]+x the bound" \
  "$TEST_TMPDIR/output.txt" || { echo "no refit figures"; exit 1; }
run=$(sed -n 's/.*network namespaces (\(tdm[0-9]*\)-\*).*/\1/p' "$TEST_TMPDIR/output.txt" | head -1)
[[ -n $run ]] || { echo "the run named no namespaces"; exit 1; }
if ip netns list | grep -q "^$run-"; then
  echo "namespaces of $run left behind"; exit 1
fi
echo "refit_bench_test: passed"
