#!/usr/bin/env bash
# refit_bench.py on a small cluster: 2 trainer ranks publish their shards of three versions, two
# replicas fetch each one over shaped links, from the store and then relayed (the second replica
# reads from the first), the figures are printed, and no namespace of the run outlives it. Needs
# root and the machine's namespaces, hence tag "local" in BUILD.bazel.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
python3 "$root/tools/cluster/refit_bench.py" --bin="$root" --ranks=2 --replicas=2 --rate=1gbit \
  --mib=2 --versions=3 --strategies=store,chain --out="$TEST_TMPDIR/refit" |
  tee "$TEST_TMPDIR/output.txt"
grep -Eq "2 replicas, every one from the store: refit [0-9.]+-[0-9.]+ s = [0-9.]+-[0-9.]+x the bound .*0 of 4 fetches relayed" \
  "$TEST_TMPDIR/output.txt" || { echo "no figures of the refit from the store"; exit 1; }
# The two timed versions reached the second replica through the first.
grep -Eq "2 replicas, relayed along a chain: refit .*2 of 4 fetches relayed" \
  "$TEST_TMPDIR/output.txt" || { echo "the chain did not relay"; cat "$TEST_TMPDIR"/refit/nodes-chain-*.log; exit 1; }
runs=$(sed -n 's/.*network namespaces (\(tdm[0-9]*\)-\*).*/\1/p' "$TEST_TMPDIR/output.txt" | sort -u)
[[ -n $runs ]] || { echo "the run named no namespaces"; exit 1; }
for run in $runs; do
  if ip netns list | grep -q "^$run-"; then
    echo "namespaces of $run left behind"; exit 1
  fi
done
echo "refit_bench_test: passed"
