"""Forwards each rules_java rule that @bazel_tools loads to the native rule of Bazel 4.2.3."""

def java_binary(**kwargs):
    native.java_binary(**kwargs)

def java_import(**kwargs):
    native.java_import(**kwargs)

def java_library(**kwargs):
    native.java_library(**kwargs)

def java_proto_library(**kwargs):
    native.java_proto_library(**kwargs)

def java_runtime(**kwargs):
    native.java_runtime(**kwargs)

def java_test(**kwargs):
    native.java_test(**kwargs)

def java_toolchain(**kwargs):
    native.java_toolchain(**kwargs)
