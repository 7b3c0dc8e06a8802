"""cc_grpc_library: C++ messages and gRPC stubs from .proto files, with the system protoc.

Generated headers are included by their proto path, e.g. "cohort/v1/coordinator.grpc.pb.h".
"""

def cc_grpc_library(name, srcs, deps = [], **kwargs):
    """Generates and compiles the C++ for `srcs` (all in this package, imported by proto path).

    Args:
      name: the cc_library to create.
      srcs: .proto files under this package; their import path is relative to the package.
      deps: further cc_library deps.
      **kwargs: passed to the cc_library.
    """
    pkg = native.package_name()
    stems = [s[:-len(".proto")] for s in srcs]
    hdrs = [s + ".pb.h" for s in stems] + [s + ".grpc.pb.h" for s in stems]
    cc_srcs = [s + ".pb.cc" for s in stems] + [s + ".grpc.pb.cc" for s in stems]
    native.genrule(
        name = name + "_codegen",
        srcs = srcs,
        outs = hdrs + cc_srcs,
        cmd = " ".join([
            "protoc",
            "--proto_path=" + (pkg if pkg else "."),
            "--proto_path=/usr/include",
            "--cpp_out=$(GENDIR)/" + pkg,
            "--grpc_out=$(GENDIR)/" + pkg,
            "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)",
        ] + ["$(location %s)" % s for s in srcs]),
    )
    native.cc_library(
        name = name,
        srcs = cc_srcs,
        hdrs = hdrs,
        includes = ["."],
        deps = deps + ["//third_party:grpc", "//third_party:protobuf"],
        **kwargs
    )
