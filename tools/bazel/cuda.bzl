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

# What every kernel's .cu includes: the host API's types and the launch helpers.
SHARED_HDRS = ["//kernels/cuda:device.h", "//kernels/cuda:launch.cuh"]

def tandem_cuda_library(name, srcs, hdrs = [], cuda_hdrs = [], deps = [], visibility = None):
    """Compiles .cu files with nvcc and wraps the objects in a cc_library tagged "cuda".

    Headers in hdrs are the host-side C++ API, so dependents need no CUDA headers; cuda_hdrs are
    device-side headers the .cu files include (shared device functions, CPU twins' headers).
    The package's device.h and launch.cuh are always available to the .cu files.
    Targets are tagged "cuda": `./tandem test` skips them where nvcc is missing.
    """
    nvcc_inputs = []
    for header in hdrs + cuda_hdrs + SHARED_HDRS:
        label = header if header.startswith("//") else "//%s:%s" % (native.package_name(), header)
        if label not in nvcc_inputs:
            nvcc_inputs.append(label)
    objects = []
    for src in srcs:
        obj = src[:-len(".cu")] + ".cu.o"
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + nvcc_inputs,
            outs = [obj],
            # nvcc names its temporary files after its pid, and sandboxed actions all run as
            # pid 2 over a shared /tmp: parallel compiles collided. Each gets its own TMPDIR.
            cmd = ("scratch=$$(mktemp -d) && TMPDIR=$$scratch /usr/local/cuda/bin/nvcc %s -c " +
                   "$(location %s) -o $@; status=$$?; rm -rf $$scratch; exit $$status") % (
                " ".join(NVCC_FLAGS),
                src,
            ),
            tags = ["cuda"],
        )
        objects.append(obj)
    # linkstatic: the static CUDA runtime's symbols are hidden, so CUDA code must never sit in
    # a shared library of a dynamically linked test, apart from the runtime in the executable.
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        linkstatic = True,
        deps = deps + ["//third_party:absl", "//third_party:cuda_runtime"],
        tags = ["cuda"],
        visibility = visibility,
    )

def tandem_cuda_test(name, srcs, deps = []):
    """A GoogleTest binary for CUDA kernels: skips without a GPU, links everything statically so
    the binary built here runs on the device machine (see tools/gpu_check)."""
    native.cc_test(
        name = name,
        srcs = srcs,
        linkstatic = True,
        tags = ["cuda"],
        deps = deps + [
            "//kernels/cuda:testing",
            "//third_party:gtest_main",
        ],
    )
