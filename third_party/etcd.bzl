"""A repository rule wrapping etcd's v3 API .proto files, as Debian ships them, as @etcd_api.

golang-etcd-server-dev installs etcd 3.4's .proto files under /usr/share/gocode/src/go.etcd.io/etcd;
they import gogoproto/gogo.proto (golang-github-gogo-protobuf-dev) and google/api/annotations.proto
(the googleapis copy in golang-github-grpc-ecosystem-grpc-gateway-dev), both pulled in by that
package. The files are symlinked unchanged, at their import paths, and compiled with the system
protoc and grpc_cpp_plugin into one cc_library, @etcd_api//:etcd_api. The gogoproto and HTTP
annotation options are compiled too (they are plain proto2 extensions) and have no effect in C++.

Headers are included by import path: "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h".
"""

_GOCODE = "/usr/share/gocode/src"

# import path -> installed file
_PROTOS = {
    "etcd/mvcc/mvccpb/kv.proto": "go.etcd.io/etcd/mvcc/mvccpb/kv.proto",
    "etcd/auth/authpb/auth.proto": "go.etcd.io/etcd/auth/authpb/auth.proto",
    "etcd/etcdserver/etcdserverpb/rpc.proto": "go.etcd.io/etcd/etcdserver/etcdserverpb/rpc.proto",
    "etcd/etcdserver/api/v3election/v3electionpb/v3election.proto": "go.etcd.io/etcd/etcdserver/api/v3election/v3electionpb/v3election.proto",
    "gogoproto/gogo.proto": "github.com/gogo/protobuf/gogoproto/gogo.proto",
    "google/api/annotations.proto": "github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis/google/api/annotations.proto",
    "google/api/http.proto": "github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis/google/api/http.proto",
}

def _etcd_api_repository_impl(ctx):
    for import_path, installed in _PROTOS.items():
        source = ctx.path(_GOCODE + "/" + installed)
        if not source.exists:
            fail("etcd's .proto file %s not found: run deploy/install-deps.sh (golang-etcd-server-dev)" % source)
        ctx.symlink(source, import_path)
    stems = [p[:-len(".proto")] for p in _PROTOS.keys()]
    hdrs = [s + ".pb.h" for s in stems] + [s + ".grpc.pb.h" for s in stems]
    srcs = [s + ".pb.cc" for s in stems] + [s + ".grpc.pb.cc" for s in stems]
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

genrule(
    name = "etcd_api_codegen",
    srcs = {protos},
    outs = {outs},
    cmd = " ".join([
        "protoc",
        "--proto_path=$$(dirname $(execpath gogoproto/gogo.proto))/..",
        "--proto_path=/usr/include",
        "--cpp_out=$(RULEDIR)",
        "--grpc_out=$(RULEDIR)",
        "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)",
    ] + {imports}),
)

cc_library(
    name = "etcd_api",
    srcs = {srcs},
    hdrs = {hdrs},
    includes = ["."],
    deps = ["@cohort//third_party:grpc", "@cohort//third_party:protobuf"],
)
""".format(
        protos = repr(sorted(_PROTOS.keys())),
        outs = repr(hdrs + srcs),
        srcs = repr(srcs),
        hdrs = repr(hdrs),
        imports = repr(sorted(_PROTOS.keys())),
    ))

etcd_api_repository = repository_rule(
    implementation = _etcd_api_repository_impl,
    local = True,
)
