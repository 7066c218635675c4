"""libFuzzer targets for parsers of outside bytes."""

def tandem_fuzz_test(name, srcs, deps, corpus):
    """A libFuzzer binary `name`_fuzzer and a test `name` that runs it from its seed corpus.

    srcs define LLVMFuzzerTestOneInput. corpus is the package's directory of seed inputs.
    Both targets are "manual" and tagged "fuzz": they build only with `--config=fuzz` (clang with
    libFuzzer, ASan and UBSan), which `./tandem test` runs in an output base of its own so the
    gcc build stays cached. The test runs a bounded number of executions (FUZZ_RUNS, default
    20000; `./tandem fuzz N` runs N) and fails on any crash, leak or sanitizer report, leaving
    the crashing input among the test's outputs.
    """
    native.cc_binary(
        name = name + "_fuzzer",
        srcs = srcs,
        deps = deps,
        linkopts = ["-fsanitize=fuzzer"],
        testonly = True,
        tags = ["manual", "fuzz"],
    )
    native.sh_test(
        name = name,
        srcs = ["//tools/bazel:run_fuzzer.sh"],
        args = ["$(location :%s_fuzzer)" % name, native.package_name() + "/" + corpus],
        data = [":%s_fuzzer" % name] + native.glob([corpus + "/*"]),
        tags = ["manual", "fuzz"],
    )
