#!/usr/bin/env bash
# Builds cohort with Bazel and installs it under a prefix, for programs built outside this tree
# (issue 12):
#   PREFIX/bin/            cohortd cohort cohort-worker cohort-store cohort-bench
#   PREFIX/LIBDIR/         libcohort_comm.so (worker/base + worker/comm, no libtorch) and
#                          libcohort_torch.so (worker/autograd, train, graph; needs libcohort_comm)
#   PREFIX/include/cohort/ their public headers, included as "worker/comm/bootstrap.h"
#   PREFIX/LIBDIR/cmake/cohort/   find_package(cohort CONFIG): cohort::comm, cohort::torch
#   PREFIX/LIBDIR/pkgconfig/      cohort.pc (the libtorch layer) and cohort-comm.pc
#
# Usage:
#   deploy/install.sh --prefix DIR [--libdir lib] [--destdir STAGE] [--config cuda] [--no-build]
#   deploy/install.sh --help
# Then, in a CMake project:  find_package(cohort CONFIG REQUIRED)   (-DCMAKE_PREFIX_PATH=DIR)
#                            target_link_libraries(app PRIVATE cohort::torch)
# or:                        g++ -std=c++17 app.cc $(PKG_CONFIG_PATH=DIR/lib/pkgconfig pkg-config --cflags --libs cohort)
set -euo pipefail

usage() {
  cat <<'EOF'
usage: deploy/install.sh --prefix DIR [options]

Builds cohort's binaries and its worker library with Bazel, then installs them under DIR.

  --prefix DIR     where the files go and where the CMake/pkg-config files say they are (required)
  --libdir NAME    library folder under the prefix (default: lib; the .deb uses lib/<multiarch>)
  --destdir STAGE  copy into STAGE/DIR instead of DIR (packaging: the files still name DIR)
  --config NAME    a Bazel --config for the build, e.g. cuda (NCCL, pure_nccl); repeatable
  --no-build       install what the last build left in bazel-bin (no bazel build)
  --help           this text

Installs: bin/ (cohortd, cohort, cohort-worker, cohort-store, cohort-bench), LIBDIR/libcohort_comm.so
and LIBDIR/libcohort_torch.so, include/cohort/ (the library's public headers),
LIBDIR/cmake/cohort/cohortConfig.cmake (targets cohort::comm, cohort::torch) and
LIBDIR/pkgconfig/cohort.pc, cohort-comm.pc.
EOF
}

prefix="" libdir="lib" destdir="" build=1 bazel_flags=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) [[ $# -ge 2 ]] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --libdir) [[ $# -ge 2 ]] || { echo "install.sh: --libdir needs a name" >&2; exit 2; }; libdir=$2; shift 2 ;;
    --destdir) [[ $# -ge 2 ]] || { echo "install.sh: --destdir needs a directory" >&2; exit 2; }; destdir=$2; shift 2 ;;
    --config) [[ $# -ge 2 ]] || { echo "install.sh: --config needs a name" >&2; exit 2; }; bazel_flags+=("--config=$2"); shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$prefix" ]] || { echo "install.sh: --prefix DIR is required (see --help)" >&2; exit 2; }
# The CMake and pkg-config files name the prefix: it must be absolute.
[[ "$prefix" == /* ]] || prefix="$(pwd)/$prefix"
[[ "$libdir" != /* && "$libdir" != *..* ]] || { echo "install.sh: --libdir '$libdir' must be a relative path under the prefix" >&2; exit 2; }
prefix=${prefix%/}

cd "$(dirname "$0")/.."
version=$(sed -nE 's/.*kVersion = "([^"]+)".*/\1/p' worker/base/version.h)
[[ -n "$version" ]] || { echo "install.sh: no kVersion in worker/base/version.h" >&2; exit 1; }
soversion=$(sed -nE 's/^COHORT_SOVERSION = "([^"]+)".*/\1/p' deploy/lib/BUILD)
[[ -n "$soversion" ]] || { echo "install.sh: no COHORT_SOVERSION in deploy/lib/BUILD" >&2; exit 1; }

# label → installed name.
binaries=(
  "//daemon:cohortd"
  "//client:cohort"
  "//worker/runner:cohort-worker"
  "//worker/comm/store:cohort-store"
  "//bench:cohort-bench"
)
libraries=("//deploy/lib:cohort_comm" "//deploy/lib:cohort_torch")

if [[ $build -eq 1 ]]; then
  echo "install.sh: bazel build ${binaries[*]} ${libraries[*]}"
  bazel build "${bazel_flags[@]}" "${binaries[@]}" "${libraries[@]}"
fi
bin_dir=$(bazel info "${bazel_flags[@]}" bazel-bin 2>/dev/null)
exec_root=$(bazel info "${bazel_flags[@]}" execution_root 2>/dev/null)

root="${destdir%/}$prefix"
install -d "$root/bin" "$root/$libdir/cmake/cohort" "$root/$libdir/pkgconfig" "$root/include/cohort"

for label in "${binaries[@]}"; do
  path="$bin_dir/${label#//}"; path=${path/://}
  [[ -x "$path" ]] || { echo "install.sh: $path missing: build $label (drop --no-build)" >&2; exit 1; }
  install -m 0755 "$path" "$root/bin/"
done

for label in "${libraries[@]}"; do
  name=${label##*:}
  so="$bin_dir/deploy/lib/lib$name.so"
  manifest="$bin_dir/deploy/lib/$name.headers"
  [[ -f "$so" && -f "$manifest" ]] || { echo "install.sh: $so or $manifest missing: build $label (drop --no-build)" >&2; exit 1; }
  # The real file carries the full version; the soname link is what programs load, the bare
  # name is what the linker finds.
  install -m 0644 "$so" "$root/$libdir/lib$name.so.$version"
  ln -sfn "lib$name.so.$version" "$root/$libdir/lib$name.so.$soversion"
  ln -sfn "lib$name.so.$soversion" "$root/$libdir/lib$name.so"
  while IFS=$'\t' read -r src dest; do
    install -D -m 0644 "$exec_root/$src" "$root/include/cohort/$dest"
  done <"$manifest"
done

# Where libtorch is: Debian's libtorch-dev, or COHORT_LIBTORCH (as the Bazel build uses it).
multiarch=$(gcc -print-multiarch)
if [[ -n "${COHORT_LIBTORCH:-}" ]]; then
  torch_cflags="-I$COHORT_LIBTORCH/include -I$COHORT_LIBTORCH/include/torch/csrc/api/include"
  torch_libs="-L$COHORT_LIBTORCH/lib -Wl,-rpath,$COHORT_LIBTORCH/lib"
  torch_cmake_hint="set(Torch_DIR \"$COHORT_LIBTORCH/share/cmake/Torch\" CACHE PATH \"libtorch's CMake package\")"
else
  torch_cflags="-I/usr/include/torch/csrc/api/include"
  torch_libs=""
  torch_cmake_hint=""
fi

# A program finds the libraries in a non-system prefix through its RUNPATH.
rpath=' -Wl,-rpath,${libdir}'
[[ "$prefix" == /usr ]] && rpath=''

# pkg-config: cohort-comm (no libtorch) and cohort (the libtorch layer over it).
# libcohort_torch is linked --no-as-needed, like libtorch: it registers torchrun's c10d store
# connector (and init methods) from static initializers, so a program that calls none of its
# functions still needs it loaded, and a linker defaulting to --as-needed would drop it. One -Wl
# token: pkg-config drops repeated flags, keeping the last, so a separate -Wl,--pop-state would
# merge with a dependency's (grpc's) and leave every library after it --no-as-needed.
cat >"$root/$libdir/pkgconfig/cohort-comm.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/$libdir
includedir=\${prefix}/include/cohort

Name: cohort-comm
Description: cohort's collective-communication core (stores, init methods, UCX, communicators)
Version: $version
Requires: fmt spdlog ucx
Cflags: -I\${includedir}
Libs: -L\${libdir}$rpath -lcohort_comm
EOF
cat >"$root/$libdir/pkgconfig/cohort.pc" <<EOF
prefix=$prefix
libdir=\${prefix}/$libdir
includedir=\${prefix}/include/cohort

Name: cohort
Description: cohort's worker library for libtorch programs (autograd communication, multi-node optimizer, datasets, checkpoints)
Version: $version
Requires: cohort-comm protobuf grpc++
Cflags: -I\${includedir} $torch_cflags
Libs: -L\${libdir} $torch_libs -Wl,--push-state,--no-as-needed,-lcohort_torch,-ltorch,-ltorch_cpu,-lc10,--pop-state
EOF

# CMake: relocatable (the prefix is found from this file's place), dependencies through
# Debian's own CMake packages.
up=$(tr -cd / <<<"$libdir/cmake/cohort" | wc -c)
up=$((up + 1))
prefix_expr='${CMAKE_CURRENT_LIST_DIR}'
for ((i = 0; i < up; i++)); do prefix_expr="$prefix_expr/.."; done
cat >"$root/$libdir/cmake/cohort/cohortConfig.cmake" <<EOF
# cohort $version: find_package(cohort CONFIG REQUIRED) defines
#   cohort::comm   libcohort_comm (worker/base + worker/comm: no libtorch)
#   cohort::torch  libcohort_torch (worker/autograd, train, graph) and cohort::comm
# Headers are included from the workspace root: #include "worker/comm/bootstrap.h".
include(CMakeFindDependencyMacro)
get_filename_component(_cohort_prefix "$prefix_expr" ABSOLUTE)

find_dependency(Threads)
find_dependency(fmt)
find_dependency(spdlog)
find_dependency(ucx)
# libcohort_torch holds the generated protos (cohort/v1/*.pb.h are among its headers).
find_dependency(Protobuf)
find_dependency(gRPC)
$torch_cmake_hint
find_dependency(Torch)

if(NOT TARGET cohort::comm)
  add_library(cohort::comm SHARED IMPORTED)
  set_target_properties(cohort::comm PROPERTIES
    IMPORTED_LOCATION "\${_cohort_prefix}/$libdir/libcohort_comm.so.$version"
    IMPORTED_SONAME "libcohort_comm.so.$soversion"
    INTERFACE_INCLUDE_DIRECTORIES "\${_cohort_prefix}/include/cohort"
    INTERFACE_COMPILE_FEATURES cxx_std_17
    INTERFACE_LINK_LIBRARIES "fmt::fmt;spdlog::spdlog;ucx::ucp;ucx::ucs;Threads::Threads")
endif()
# An interface target naming the library between --no-as-needed flags (kept in place on the link
# line): it registers torchrun's c10d store connector from static initializers, so a program that
# calls none of its functions still needs it loaded, and --as-needed would drop it.
if(NOT TARGET cohort::torch)
  add_library(cohort::torch INTERFACE IMPORTED)
  set_target_properties(cohort::torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "\${_cohort_prefix}/include/cohort"
    INTERFACE_LINK_LIBRARIES "-Wl,--push-state,--no-as-needed;\${_cohort_prefix}/$libdir/libcohort_torch.so.$version;-Wl,--pop-state;cohort::comm;\${TORCH_LIBRARIES};protobuf::libprotobuf;gRPC::grpc++")
endif()
unset(_cohort_prefix)
EOF
cat >"$root/$libdir/cmake/cohort/cohortConfigVersion.cmake" <<EOF
# cohort $version: any request of the same major version, not newer than this one, is met
# (SameMajorVersion; 0.x: the same minor version).
set(PACKAGE_VERSION "$version")
string(REPLACE "." ";" _cohort_have "\${PACKAGE_VERSION}")
string(REPLACE "." ";" _cohort_want "\${PACKAGE_FIND_VERSION}")
list(GET _cohort_have 0 _cohort_have_major)
list(GET _cohort_have 1 _cohort_have_minor)
set(PACKAGE_VERSION_COMPATIBLE FALSE)
if(NOT PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
elseif(NOT PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION
       AND PACKAGE_FIND_VERSION_MAJOR EQUAL _cohort_have_major
       AND (NOT _cohort_have_major EQUAL 0 OR PACKAGE_FIND_VERSION_MINOR EQUAL _cohort_have_minor))
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
unset(_cohort_have)
unset(_cohort_want)
EOF

echo "install.sh: installed cohort $version under ${destdir:+$destdir}$prefix"
