#!/usr/bin/env bash
# Runs a libFuzzer binary for FUZZ_RUNS executions, starting from the seed corpus in the tree.
#   run_fuzzer.sh FUZZER SEED_DIR
# New inputs go to a scratch corpus (the tree's seeds stay as they are); a crashing input is
# written among the test's undeclared outputs, so it survives the sandbox.
set -euo pipefail
fuzzer=$1
seeds=$2
runs=${FUZZ_RUNS:-20000}
scratch="${TEST_TMPDIR:-$(mktemp -d)}/corpus"
artifacts="${TEST_UNDECLARED_OUTPUTS_DIR:-$scratch}"
mkdir -p "$scratch" "$artifacts"
exec "$fuzzer" -runs="$runs" -print_final_stats=1 -artifact_prefix="$artifacts/" \
  "$scratch" "$seeds"
