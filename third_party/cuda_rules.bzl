"""cuda_library: .cu files compiled by nvcc into objects a cc_library links, for --config=cuda.

Bazel 4.2 has no CUDA support of its own, and the repository builds offline, so this is a small
rule of our own: one nvcc action per .cu file (nvcc from @local_cuda, i.e. COHORT_CUDA_HOME or
/usr/local/cuda), whose position-independent objects become the srcs of a cc_library that also
depends on //third_party:cuda (libcudart).

Without --config=cuda the rule produces no files and runs no action, so `bazel build //...` on a
machine without the toolkit still succeeds; code that calls into the objects must itself be
selected on //third_party:cuda_enabled.

    load("//third_party:cuda_rules.bzl", "cuda_library")

    cuda_library(
        name = "device_reduce_kernels",
        srcs = ["device_reduce_kernels.cu"],
        hdrs = ["device_reduce_kernels.h"],
    )

GPU architectures: --define=cohort_cuda_archs=80,90 (default below) picks the SASS targets; PTX
for the highest one is embedded too, so newer GPUs JIT-compile it.
"""

_DEFAULT_ARCHS = "80,90"

def _cuda_objects_impl(ctx):
    if not ctx.attr.enabled:
        return [DefaultInfo(files = depset())]
    if not ctx.files._nvcc:
        fail("--config=cuda but no nvcc: install the CUDA toolkit at /usr/local/cuda or set COHORT_CUDA_HOME")
    nvcc = ctx.files._nvcc[0]
    archs = ctx.var.get("cohort_cuda_archs", _DEFAULT_ARCHS).split(",")
    headers = depset(
        ctx.files.hdrs,
        transitive = [dep[CcInfo].compilation_context.headers for dep in ctx.attr.deps],
    )
    outs = []
    for src in ctx.files.srcs:
        # .pic.o: Bazel links these into both shared test libraries and static binaries.
        out = ctx.actions.declare_file("_nvcc/%s/%s.pic.o" % (ctx.label.name, src.basename[:-len(".cu")]))
        args = ctx.actions.args()
        args.add_all(["-c", "-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-Xcompiler", "-Wall"])

        # -Werror on our kernels as on the rest of the project code (nvcc's own warnings included).
        args.add_all(["-Werror", "all-warnings"])

        # Includes from the workspace root, as in every other file of the project.
        args.add_all(["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path])
        for arch in archs:
            args.add("-gencode=arch=compute_{a},code=sm_{a}".format(a = arch.strip()))
        args.add("-gencode=arch=compute_{a},code=compute_{a}".format(a = archs[-1].strip()))
        args.add_all(ctx.attr.copts)
        args.add_all(["-o", out.path, src.path])
        ctx.actions.run(
            executable = nvcc,
            arguments = [args],
            inputs = depset([src], transitive = [headers]),
            outputs = [out],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            # nvcc runs the host compiler (gcc) from PATH.
            use_default_shell_env = True,
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
        "enabled": attr.bool(default = False),
        "_nvcc": attr.label(default = "@local_cuda//:nvcc", allow_files = True, cfg = "exec"),
    },
    doc = "nvcc-compiled objects of .cu files; empty unless enabled (under --config=cuda).",
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library of nvcc-compiled .cu files; an empty library outside --config=cuda.

    Args:
      name: the cc_library's name (the objects are `name + "_nvcc"`).
      srcs: .cu files.
      hdrs: headers of the library (plain C++ the host compiler also reads).
      deps: cc_library dependencies whose headers the .cu files include.
      copts: extra nvcc flags.
      **kwargs: passed to the cc_library (visibility, tags, ...).
    """
    cuda_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        enabled = select({
            "//third_party:cuda_enabled": True,
            "//conditions:default": False,
        }),
    )
    native.cc_library(
        name = name,
        # cc_library rejects a srcs label with no files, so the objects are listed only when built.
        srcs = select({
            "//third_party:cuda_enabled": [":" + name + "_nvcc"],
            "//conditions:default": [],
        }),
        hdrs = hdrs,
        deps = deps + select({
            "//third_party:cuda_enabled": ["//third_party:cuda"],
            "//conditions:default": [],
        }),
        **kwargs
    )
