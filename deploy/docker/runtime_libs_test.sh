#!/usr/bin/env bash
# The image's runtime stage installs exactly the packages whose libraries the binaries load, and
# the CUDA variant's list names exactly the CUDA libraries they load.
#   runtime_libs_test.sh [--variant=cpu|cuda] BINARY...
# cpu: binaries built without nvcc, which must load no CUDA library (runtime-packages-cuda.txt
# cannot be checked against them); cuda: built with nvcc, as in the CUDA image's build stage or
# under Bazel where @local_cuda found nvcc: runtime-packages-cuda.txt must name exactly the CUDA
# libraries they link or dlopen. Both variants install runtime-packages.txt.
set -euo pipefail
dir=${TEST_SRCDIR:+$TEST_SRCDIR/$TEST_WORKSPACE/deploy/docker}
dir=${dir:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
variant=cpu
if [[ "${1:-}" == --variant=* ]]; then
  variant=${1#--variant=}
  shift
fi
if [[ "$variant" != cpu && "$variant" != cuda ]]; then
  echo "runtime_libs_test: --variant must be cpu or cuda, not $variant" >&2
  exit 2
fi

# runtime-packages-cuda.txt: "SONAME SOURCE" lines.
cuda_list=$dir/runtime-packages-cuda.txt
if malformed=$(grep -v '^#' "$cuda_list" | awk 'NF && NF != 2'); [[ -n "$malformed" ]]; then
  echo "runtime_libs_test: runtime-packages-cuda.txt lines must be 'SONAME SOURCE': $malformed" >&2
  exit 1
fi
listed_cuda=$(grep -v '^#' "$cuda_list" | awk 'NF {print $1}' | sort -u)

# Debian packages, both variants; the CUDA list's libraries are accounted for by that list.
needed=$("$dir/runtime_libs.sh" --except="$(echo "$listed_cuda" | paste -sd,)" "$@")
listed=$(grep -v '^#' "$dir/runtime-packages.txt" | sort -u)
if [[ "$needed" != "$listed" ]]; then
  echo "runtime_libs_test: deploy/docker/runtime-packages.txt differs from what the binaries load:" >&2
  diff <(echo "$listed") <(echo "$needed") >&2 || true
  exit 1
fi
echo "runtime stage covers the $(echo "$needed" | wc -l) packages of $# binaries"

# CUDA libraries.
cuda_needed=$("$dir/cuda_libs.sh" "$@")
if [[ "$variant" == cpu ]]; then
  if [[ -n "$cuda_needed" ]]; then
    echo "runtime_libs_test: binaries built without CUDA load CUDA libraries: ${cuda_needed//$'\n'/ }" >&2
    echo "  (were they built with nvcc? then run with --variant=cuda)" >&2
    exit 1
  fi
  echo "no CUDA library loaded; runtime-packages-cuda.txt not checked (built without nvcc)"
  exit 0
fi
if [[ -z "$cuda_needed" ]]; then
  echo "runtime_libs_test: --variant=cuda, but the binaries load no CUDA library: built without nvcc?" >&2
  exit 1
fi
if [[ "$cuda_needed" != "$listed_cuda" ]]; then
  echo "runtime_libs_test: deploy/docker/runtime-packages-cuda.txt differs from the CUDA libraries the binaries load:" >&2
  diff <(echo "$listed_cuda") <(echo "$cuda_needed") >&2 || true
  exit 1
fi
echo "CUDA runtime stage covers the $(echo "$cuda_needed" | wc -l) CUDA libraries of $# binaries: ${cuda_needed//$'\n'/ }"
