#!/usr/bin/env bash
# Writes a demo-sized and a wider model with engine_cuda_bench (CPU logits without a GPU) and
# checks that tools/torch_reference/moe_reference.py, run by Debian's python3 (python3-torch) on
# the CPU, computes the same logits and the same greedy generations (its key/value cache).
set -euo pipefail
root=${TEST_SRCDIR:-$PWD}/${TEST_WORKSPACE:-}
for size in "" "--d_model=128 --num_layers=3 --num_experts=16 --top_k=4"; do
  dir=$(mktemp -d "${TEST_TMPDIR:-/tmp}/reference.XXXXXX")
  # shellcheck disable=SC2086
  "$root/engine/cuda/engine_cuda_bench" --sequences=3 --cpu $size --out_dir="$dir"
  /usr/bin/python3 "$root/tools/torch_reference/moe_reference.py" "$dir" --device=cpu \
    --tolerance=1e-5 --min_identical=1
done
