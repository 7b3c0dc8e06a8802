"""Wraps Debian's OpenMPI (libopenmpi-dev) as @openmpi//:mpi — for bench/mpi_baseline only.

cohort never links MPI; the benchmark's peer does. A machine without OpenMPI still builds
everything else: the target then fails with a message saying what to install.
"""

def _openmpi_repository_impl(ctx):
    multiarch = ctx.execute(["gcc", "-print-multiarch"]).stdout.strip()
    root = "/usr/lib/%s/openmpi" % multiarch
    found = ctx.path(root + "/include/mpi.h").exists
    if found:
        ctx.symlink(root + "/include", "include")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "mpi",
    hdrs = {hdrs},
    includes = {includes},
    linkopts = {linkopts},
)
""".format(
        hdrs = 'glob(["include/**/*.h"])' if found else "[]",
        includes = '["include"]' if found else "[]",
        linkopts = '["-L{r}/lib", "-Wl,-rpath,{r}/lib", "-lmpi"]'.format(r = root) if found else "[]",
    ))

openmpi_repository = repository_rule(
    implementation = _openmpi_repository_impl,
    local = True,
)
