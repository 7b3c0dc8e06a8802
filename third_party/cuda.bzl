"""A repository rule wrapping the CUDA toolkit and NCCL as @local_cuda//:cuda and :nccl.

Looks in COHORT_CUDA_HOME, else /usr/local/cuda. The libraries are only linked under
--config=cuda (see //third_party:cuda_enabled); a machine without the toolkit still builds.
"""

def _cuda_repository_impl(ctx):
    home = ctx.os.environ.get("COHORT_CUDA_HOME", "/usr/local/cuda")
    found = ctx.path(home + "/include/cuda_runtime.h").exists
    if found:
        ctx.symlink(home + "/include", "include")
        ctx.symlink(home + "/bin", "bin")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# True when the toolkit was found at {home}.
CUDA_FOUND = {found}

cc_library(
    name = "cuda",
    hdrs = {hdrs},
    includes = {includes},
    linkopts = {cudart},
)

cc_library(
    name = "nccl",
    linkopts = {nccl},
    deps = [":cuda"],
)

filegroup(
    name = "nvcc",
    srcs = {nvcc},
)
""".format(
        home = home,
        found = found,
        hdrs = 'glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"])' if found else "[]",
        includes = '["include"]' if found else "[]",
        cudart = '["-L{h}/lib64", "-L{h}/lib", "-Wl,-rpath,{h}/lib64", "-Wl,-rpath,{h}/lib", "-lcudart"]'.format(h = home) if found else "[]",
        nccl = '["-L{h}/lib64", "-L{h}/lib", "-Wl,-rpath,{h}/lib64", "-Wl,-rpath,{h}/lib", "-lnccl"]'.format(h = home) if found else "[]",
        nvcc = '["bin/nvcc"]' if found else "[]",
    ))
    ctx.file("defs.bzl", "CUDA_HOME = %r\nCUDA_FOUND = %s\n" % (home, found))

cuda_repository = repository_rule(
    implementation = _cuda_repository_impl,
    environ = ["COHORT_CUDA_HOME"],
    local = True,
)
