"""Whether this machine can build CUDA code: @local_cuda//:defs.bzl defines HAS_CUDA.

Machines without the CUDA toolkit (a CPU-only Docker build, a laptop) still build every
service; their --device=cuda reports that the binary was built without CUDA.
"""

def _local_cuda_impl(repository_ctx):
    has_cuda = repository_ctx.path("/usr/local/cuda/bin/nvcc").exists
    repository_ctx.file("BUILD.bazel", "")
    repository_ctx.file("defs.bzl", "HAS_CUDA = %s\n" % has_cuda)

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    local = True,  # Re-evaluated when the machine changes, not cached across them.
)
