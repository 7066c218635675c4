"""C++ code generation for Tandem's protos and gRPC services."""

GOOGLEAPIS = "third_party/googleapis"

def tandem_proto_library(name, proto, deps = [], visibility = None):
    """Generates and compiles the message and gRPC stub code of one .proto file.

    The macro must be used in the package that is the proto root (proto/, or
    third_party/googleapis for the vendored googleapis protos), so that generated headers
    are included as "tandem/<package>/v1/<file>.pb.h" just like the imports.

    Args:
      name: the cc_library holding the generated code.
      proto: path of the .proto file relative to the package, e.g. "tandem/trainer/v1/trainer.proto".
      deps: tandem_proto_library targets whose .proto files this one imports.
      visibility: visibility of the cc_library.
    """
    base = proto[:-len(".proto")]
    outs = [base + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    imported = [dep + "_srcs" for dep in deps]
    native.filegroup(
        name = name + "_srcs",
        srcs = [proto] + imported,
    )
    # The vendored googleapis protos (google/api/...) are a proto root of their own.
    roots = [native.package_name()]
    if native.package_name() != GOOGLEAPIS:
        roots.append(GOOGLEAPIS)
    native.genrule(
        name = name + "_codegen",
        srcs = [proto] + imported,
        outs = outs,
        cmd = ("protoc %s --cpp_out=$(GENDIR)/%s --grpc_out=$(GENDIR)/%s " +
               "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin $(location %s)") % (
            " ".join(["--proto_path=" + root for root in roots]),
            native.package_name(),
            native.package_name(),
            proto,
        ),
    )
    native.cc_library(
        name = name,
        srcs = [out for out in outs if out.endswith(".cc")],
        hdrs = [out for out in outs if out.endswith(".h")],
        includes = ["."],
        deps = deps + ["//third_party:grpc"],
        visibility = visibility,
    )
