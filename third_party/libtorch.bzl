"""A repository rule wrapping an installed libtorch as @libtorch//:libtorch.

Default: Debian's libtorch-dev (headers in /usr/include, libraries in the multiarch libdir).
Set COHORT_LIBTORCH to a libtorch directory (with include/ and lib/, as pytorch.org ships it,
CUDA builds included) to build cohort against that installation instead.
"""

def _libtorch_repository_impl(ctx):
    root = ctx.os.environ.get("COHORT_LIBTORCH", "")
    if root:
        include_dir = root + "/include"
        lib_dir = root + "/lib"
    else:
        include_dir = "/usr/include"
        lib_dir = "/usr/lib/" + ctx.execute(["gcc", "-print-multiarch"]).stdout.strip()
    api_dir = include_dir + "/torch/csrc/api/include"
    if not ctx.path(api_dir).exists:
        fail("libtorch headers not found at %s: run deploy/install-deps.sh (libtorch-dev) or set COHORT_LIBTORCH to a libtorch directory" % api_dir)

    # The C++ frontend's headers live one level down; expose that directory as an include root.
    ctx.symlink(api_dir, "api_include")
    hdrs = 'glob(["api_include/**/*.h"])'
    includes = '["api_include"]'
    if root:
        # A non-system installation: its top-level include/ (ATen, c10, torch) is not on the
        # compiler's default path, so it becomes an include root too.
        ctx.symlink(include_dir, "include")
        hdrs = 'glob(["api_include/**/*.h", "include/ATen/**/*.h", "include/c10/**/*.h", "include/torch/**/*.h", "include/caffe2/**/*.h"])'
        includes = '["api_include", "include"]'

    # A CUDA build of libtorch registers its CUDA kernels from libtorch_cuda / libc10_cuda, which
    # no symbol of ours references: they must be linked (inside --no-as-needed) or every CUDA
    # tensor op fails at run time with "no kernel for CUDA".
    cuda_libs = ""
    if ctx.path(lib_dir + "/libtorch_cuda.so").exists:
        cuda_libs = '"-ltorch_cuda",\n        "-lc10_cuda",'

    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "libtorch",
    hdrs = {hdrs},
    includes = {includes},
    linkopts = [
        "-L{lib}",
        "-Wl,-rpath,{lib}",
        # Operator registration happens in static initialisers: keep every library even if no
        # symbol is referenced directly, without changing --as-needed for libraries after these.
        "-Wl,--push-state,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
        {cuda_libs}
        "-Wl,--pop-state",
        "-lpthread",
    ],
)
""".format(hdrs = hdrs, includes = includes, lib = lib_dir, cuda_libs = cuda_libs))

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["COHORT_LIBTORCH"],
    local = True,
)
