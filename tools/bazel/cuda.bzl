"""nvcc-compiled CUDA libraries."""

# Hopper (H100/H200) is the device machine; PTX for compute_90 keeps newer GPUs working.
NVCC_FLAGS = [
    "-O3",
    "-std=c++20",
    "--compiler-options=-fPIC",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
    "-I.",
]

def tandem_cuda_library(name, srcs, hdrs = [], deps = [], visibility = None):
    """Compiles .cu files with nvcc and wraps the objects in a cc_library tagged "cuda".

    Headers in hdrs are the host-side C++ API, so dependents need no CUDA headers.
    Targets are tagged "cuda": `./tandem test` skips them where nvcc is missing.
    """
    objects = []
    for src in srcs:
        obj = src[:-len(".cu")] + ".cu.o"
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = "/usr/local/cuda/bin/nvcc %s -c $(location %s) -o $@" % (" ".join(NVCC_FLAGS), src),
            tags = ["cuda"],
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        deps = deps + ["//third_party:cuda_runtime"],
        tags = ["cuda"],
        visibility = visibility,
    )
