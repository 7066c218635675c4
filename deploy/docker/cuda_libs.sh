#!/usr/bin/env bash
# Prints the NVIDIA libraries (CUDA toolkit, NCCL, the driver's) the given binaries load, one
# soname per line, sorted: the ones they link (ELF NEEDED) and the ones they name to dlopen
# (the CUDA runtime, linked statically, loads the driver's libcuda.so.1 that way; ldd shows no
# such library). Read from the binaries' own bytes, so it needs no CUDA library on this
# machine. runtime_libs_test compares it with runtime-packages-cuda.txt.
set -euo pipefail

# Sonames of the driver (libcuda, libnvidia-*), the toolkit's libraries and NCCL.
pattern='lib(cuda|cudart|cublas|cublasLt|cufft|cufftw|curand|cusolver|cusolverMg|cusparse'
pattern+='|cudnn[a-z_]*|nccl|nvrtc|nvrtc-builtins|nvJitLink|nvjpeg|npp[a-z]*|nvToolsExt'
pattern+='|nvtx3interop|cupti|nvblas|nvidia-[a-z-]+)\.so(\.[0-9]+)*'

for binary in "$@"; do
  if [[ ! -f "$binary" ]]; then
    echo "cuda_libs: $binary is not a file" >&2
    exit 1
  fi
done
for binary in "$@"; do
  grep -aoE "$pattern" "$binary" || true
done | sort -u
