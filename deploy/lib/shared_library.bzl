"""cohort_shared_library: one installable .so made from cc_library targets, and its public headers.

Why not cc_binary(linkshared = 1): it links every transitive static dependency into the .so, so
libcohort_torch.so would carry a second copy of the comm core that libcohort_comm.so already
holds (two algorithm registries, two init-method registries, two flight recorders, and protobuf
aborting on a descriptor registered twice). Bazel 4.2's cc_shared_library is experimental (a
starlark flag that would change every other build's configuration). This rule links the objects
of `deps`' transitive closure *minus* those already inside the shared libraries named in
`dynamic_deps`, and links against those instead, so each global exists exactly once.

It also writes a header manifest: the public headers (hdrs) of every workspace cc_library in the
linked closure, except test helpers and targets tagged "cohort_private_headers" (linked in as
an implementation), each with its install path relative to include/cohort/. deploy/install.sh
reads it.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

CohortSharedLibraryInfo = provider(
    doc = "What a cohort_shared_library holds, so that a library above it links against it.",
    fields = {
        "owners": "depset of label strings whose objects are inside this library (and below)",
        "library": "the .so File",
    },
)

_HeadersInfo = provider(fields = {"headers": "depset of (File) public headers of workspace cc_library targets"})

# Packages whose cc_library headers are part of the installed API (the library's layers and the
# generated protos their headers include). A header under a testing/ folder is a test helper.
_API_PACKAGES = ["worker/", "proto"]

# A cc_library tagged with this is linked into the library but is its implementation (its headers
# include what the API does not expose, e.g. gRPC stubs): its headers are not installed, and no
# public header may include them (tests/install/install_test.sh checks that includes resolve).
_PRIVATE_HEADERS_TAG = "cohort_private_headers"

def _is_api_target(label):
    if label.workspace_name != "":
        return False
    return any([label.package == p or label.package.startswith(p) for p in _API_PACKAGES])

def _headers_aspect_impl(target, ctx):
    transitive = []
    for dep in getattr(ctx.rule.attr, "deps", []):
        if _HeadersInfo in dep:
            transitive.append(dep[_HeadersInfo].headers)
    direct = []
    private = _PRIVATE_HEADERS_TAG in getattr(ctx.rule.attr, "tags", [])
    if CcInfo in target and _is_api_target(target.label) and not private and not getattr(ctx.rule.attr, "testonly", False):
        direct = [
            f
            for f in target[CcInfo].compilation_context.direct_public_headers
            if "/testing/" not in f.short_path
        ]
    return [_HeadersInfo(headers = depset(direct, transitive = transitive))]

_headers_aspect = aspect(
    implementation = _headers_aspect_impl,
    attr_aspects = ["deps"],
)

def _install_path(f):
    # Generated proto headers are included by their proto path ("cohort/v1/job.pb.h"), the
    # library's own headers from the workspace root ("worker/comm/communicator.h").
    path = f.short_path
    if path.startswith("proto/"):
        return path[len("proto/"):]
    return path

def _impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )

    below = [d[CohortSharedLibraryInfo] for d in ctx.attr.dynamic_deps]
    excluded = {}
    for info in below:
        for owner in info.owners.to_list():
            excluded[owner] = True

    linker_inputs = depset(
        transitive = [d[CcInfo].linking_context.linker_inputs for d in ctx.attr.deps],
        order = "topological",
    ).to_list()
    libraries = []
    flags = []
    owners = []
    for linker_input in linker_inputs:
        owner = str(linker_input.owner)

        # A library below already holds these objects; its flags (-lfmt, -lucp: system
        # libraries these objects' users need too) stay.
        skip_objects = owner in excluded
        if not skip_objects:
            owners.append(owner)
        for library in ([] if skip_objects else linker_input.libraries):
            archive = library.pic_static_library or library.static_library
            if archive == None:
                continue

            # Whole archive: nothing inside the .so references most of the API, and static
            # registrations (algorithms, init methods) must be kept.
            libraries.append(cc_common.create_library_to_link(
                actions = ctx.actions,
                feature_configuration = feature_configuration,
                cc_toolchain = cc_toolchain,
                pic_static_library = archive,
                alwayslink = True,
            ))
        for flag in linker_input.user_link_flags:
            # libtorch's label adds -rpath to the system library dir: an installed library
            # finds Debian's libraries without it.
            if flag.startswith("-Wl,-rpath,"):
                continue
            if flag not in flags:
                flags.append(flag)

    so_name = "lib%s.so.%s" % (ctx.attr.library_name, ctx.attr.soversion)
    link_flags = ["-Wl,-soname," + so_name, "-Wl,--no-undefined"]
    additional_inputs = []
    for info in below:
        # By path: the DT_NEEDED entry is then the lower library's soname.
        link_flags.append(info.library.path)
        additional_inputs.append(info.library)
    if below:
        # The libraries sit side by side wherever they are installed.
        link_flags.append("-Wl,-rpath,$ORIGIN")

    linker_input = cc_common.create_linker_input(
        owner = ctx.label,
        libraries = depset(libraries),
        user_link_flags = depset(flags),
    )
    linking_context = cc_common.create_linking_context(linker_inputs = depset([linker_input]))
    outputs = cc_common.link(
        actions = ctx.actions,
        name = ctx.attr.library_name,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        linking_contexts = [linking_context],
        user_link_flags = link_flags,
        output_type = "dynamic_library",
        link_deps_statically = True,
        additional_inputs = additional_inputs,
    )
    library = outputs.library_to_link.resolved_symlink_dynamic_library or outputs.library_to_link.dynamic_library

    headers = depset(transitive = [d[_HeadersInfo].headers for d in ctx.attr.deps]).to_list()
    below_headers = {}
    for d in ctx.attr.dynamic_deps:
        for f in d[OutputGroupInfo].cohort_headers.to_list():
            below_headers[f.path] = True
    own_headers = [f for f in headers if f.path not in below_headers]
    manifest = ctx.actions.declare_file(ctx.label.name + ".headers")
    ctx.actions.write(
        manifest,
        "".join(["%s\t%s\n" % (f.path, _install_path(f)) for f in own_headers]),
    )

    return [
        DefaultInfo(files = depset([library, manifest] + own_headers)),
        OutputGroupInfo(cohort_headers = depset(headers)),
        CohortSharedLibraryInfo(
            owners = depset(owners, transitive = [i.owners for i in below]),
            library = library,
        ),
    ]

cohort_shared_library = rule(
    implementation = _impl,
    attrs = {
        "deps": attr.label_list(
            providers = [CcInfo],
            aspects = [_headers_aspect],
            doc = "cc_library targets whose closure (minus dynamic_deps') goes into this library",
        ),
        "dynamic_deps": attr.label_list(
            providers = [CohortSharedLibraryInfo],
            doc = "cohort_shared_library targets this one links against instead of copying",
        ),
        "library_name": attr.string(mandatory = True, doc = "'cohort_comm' makes libcohort_comm.so"),
        "soversion": attr.string(mandatory = True, doc = "the soname's version: lib<name>.so.<soversion>"),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)
