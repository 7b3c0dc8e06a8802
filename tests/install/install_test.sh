#!/usr/bin/env bash
# The installed library and the .deb, as a user outside this tree sees them (issue 12). Not a
# Bazel test (deploy/install.sh runs bazel): tests/run_all.sh runs it as a counted block.
#
#   tests/install/install_test.sh          # every check, ~2-4 minutes on a warm Bazel cache
#
# Each check prints "install: NAME: PASSED" or "install: NAME: FAILED (...)"; exits non-zero if
# any failed. Checks:
#   install        deploy/install.sh --prefix TMP builds and installs everything it lists
#   headers        every quoted #include of an installed header is installed too
#   coverage       every library target of worker/* is in one of the shared libraries
#   one_copy       libcohort_torch needs libcohort_comm and defines none of its symbols
#   cmake          tests/install/consumer builds with find_package(cohort CONFIG REQUIRED) and
#                  trains on 2 ranks over file:// (both exit 0, loss falls, parameters agree)
#   pkg_config     the same program built by `pkg-config --cflags --libs cohort`, run the same way
#   deb            deploy/package-deb.sh builds the .deb; extracted (dpkg-deb -x), its binaries
#                  print --version and its files are where the package says
#   lintian        lintian --fail-on error passes on the .deb
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

# Bounds: each step's wall time (the CMake consumer compiles one libtorch TU, ~40 s).
readonly kInstallTimeoutS=${COHORT_INSTALL_TEST_BUILD_TIMEOUT_S:-1800}  # cold Bazel build included
readonly kCompileTimeoutS=240
readonly kRunTimeoutS=60
readonly kPackageTimeoutS=600
readonly kLintianTimeoutS=300
# The shared libraries' soname version (deploy/lib/BUILD's COHORT_SOVERSION).
readonly kSoversion=$(sed -nE 's/^COHORT_SOVERSION = "([^"]+)".*/\1/p' deploy/lib/BUILD)

tmp=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
# A timeout's TERM still runs the cleanup (no rank outlives the test).
trap 'exit 143' TERM INT

failures=0
pass() { echo "install: $1: PASSED"; }
fail() { echo "install: $1: FAILED ($2)"; failures=$((failures + 1)); }

prefix="$tmp/prefix"
version=$(sed -nE 's/.*kVersion = "([^"]+)".*/\1/p' worker/base/version.h)

# --- install ---------------------------------------------------------------------------------
if timeout "$kInstallTimeoutS" deploy/install.sh --prefix "$prefix" >"$tmp/install.log" 2>&1; then
  missing=()
  for f in bin/cohortd bin/cohort bin/cohort-worker bin/cohort-store bin/cohort-bench \
           lib/libcohort_comm.so lib/libcohort_torch.so lib/libcohort_comm.so.0 \
           include/cohort/worker/comm/bootstrap.h include/cohort/worker/train/multi_node_optimizer.h \
           lib/cmake/cohort/cohortConfig.cmake lib/cmake/cohort/cohortConfigVersion.cmake \
           lib/pkgconfig/cohort.pc lib/pkgconfig/cohort-comm.pc; do
    [[ -e "$prefix/$f" ]] || missing+=("$f")
  done
  # Exactly the library's public headers: no test helpers, no program's or daemon's files, no
  # implementation header linked in (MetricsReporter: report_metrics.h is its API).
  stray=$(cd "$prefix/include/cohort" && find . -type f \( -path '*/testing/*' -o -path './worker/runner/*' \
          -o -path './daemon/*' -o -path './client/*' -o -path './worker/examples/*' -o -name '*_test.h' \
          -o -path './worker/train/metrics_reporter.h' \) | head -5)
  if [[ ${#missing[@]} -eq 0 && -z "$stray" ]]; then pass install
  else fail install "missing: ${missing[*]:-none}; not public: ${stray:-none}"; fi
else
  tail -30 "$tmp/install.log"
  fail install "deploy/install.sh exited non-zero (log above)"
  echo "install: skipping the rest: nothing installed"
  exit 1
fi

# --- headers ---------------------------------------------------------------------------------
unresolved=$(cd "$prefix/include/cohort" && grep -rhoE '^#include "[^"]+"' . | sed -E 's/#include "(.*)"/\1/' |
             sort -u | while read -r h; do [[ -f "$h" ]] || echo "$h"; done)
if [[ -z "$unresolved" ]]; then pass headers; else fail headers "not installed: $(echo $unresolved)"; fi

# --- coverage --------------------------------------------------------------------------------
# Every library target of the layers is inside one of the two shared libraries (deploy/lib/BUILD),
# except these, which are not the library's API:
#   //worker/comm:typed_values, :loopback_transport   test seams
#   //worker/base:crypto, :credentials_file           the daemon's and the CLI's
#   //worker/base:cli_flags                           the binaries' command lines (CLI11)
readonly kNotInLibrary="//worker/comm:typed_values //worker/comm:loopback_transport //worker/base:crypto //worker/base:credentials_file //worker/base:cli_flags"
layers="//worker/base/... + //worker/comm/... + //worker/autograd/... + //worker/train/... + //worker/graph/... + //worker/distributed/..."
if left=$(bazel query "kind(cc_library, $layers) except attr(testonly, 1, $layers) except deps(//deploy/lib:all)" 2>"$tmp/query.log"); then
  forgotten=$(for t in $left; do [[ " $kNotInLibrary " == *" $t "* ]] || echo "$t"; done)
  if [[ -z "$forgotten" ]]; then pass coverage
  else fail coverage "library targets in no shared library (add them to deploy/lib/BUILD): $(echo $forgotten)"; fi
else
  tail -5 "$tmp/query.log"; fail coverage "bazel query failed"
fi

# --- one_copy --------------------------------------------------------------------------------
torch_so="$prefix/lib/libcohort_torch.so"
comm_so="$prefix/lib/libcohort_comm.so"
needed=$(readelf -d "$torch_so" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p')
# strong_symbols LIB: the global symbols LIB itself defines (code and data; weak and unique
# symbols are inline functions and template statics every user may carry).
strong_symbols() { nm -D --defined-only "$1" | awk '$2 ~ /^[TDBR]$/ && $3 !~ /^(__bss_start|_edata|_end)$/ {print $3}' | sort -u; }
dup=$(comm -12 <(strong_symbols "$comm_so") <(strong_symbols "$torch_so") | head -3)
# The entry point every program calls lives in the comm library only. (grep -q reads a here-string,
# not a pipe: under pipefail, grep -q exiting at its first match would SIGPIPE the writer.)
create=_ZN6cohort4comm19create_communicator
if ! grep -qx "libcohort_comm.so.0" <<<"$needed"; then fail one_copy "libcohort_torch.so does not need libcohort_comm.so.0: $(echo $needed)"
elif ! grep -q "^$create" <<<"$(strong_symbols "$comm_so")"; then fail one_copy "libcohort_comm.so does not define create_communicator"
elif [[ -n "$dup" ]]; then fail one_copy "defined in both libraries: $dup"
else pass one_copy; fi

# run_ranks NAME BINARY: runs BINARY on 2 ranks over a file:// store; both must exit 0 and print
# their result line.
run_ranks() {
  local name=$1 binary=$2 store="$tmp/$1.store" rc=0 r
  local -a rank_pids=()
  for r in 0 1; do
    timeout "$kRunTimeoutS" "$binary" "file://$store?rank=$r&world_size=2" >"$tmp/$name.$r.log" 2>&1 &
    rank_pids+=($!); pids+=($!)
  done
  for r in 0 1; do
    wait "${rank_pids[$r]}" || { rc=1; echo "--- $name rank $r:"; cat "$tmp/$name.$r.log"; }
  done
  [[ $rc -eq 0 ]] || return 1
  for r in 0 1; do grep -q "^rank $r loss" "$tmp/$name.$r.log" || { cat "$tmp/$name.$r.log"; return 1; }; done
  cat "$tmp/$name.0.log" "$tmp/$name.1.log"
}

# needs_torch_library BINARY: BINARY (calling nothing from libcohort_torch, linked --as-needed)
# still lists it as NEEDED: its static initializers register torchrun's c10d store connector. And
# only the libraries wrapped with it: gRPC, unused, stays dropped (the --no-as-needed was popped).
needs_torch_library() {
  local needed
  needed=$(readelf -d "$1")  # not piped into grep -q: see one_copy
  grep -q "(NEEDED).*\[libcohort_torch\.so\.$kSoversion\]" <<<"$needed" && ! grep -q "(NEEDED).*\[libgrpc++" <<<"$needed"
}

# --- cmake -----------------------------------------------------------------------------------
start=$SECONDS
if ! timeout "$kCompileTimeoutS" cmake -S tests/install/consumer -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
       -DCMAKE_BUILD_TYPE=Release >"$tmp/cmake.log" 2>&1 ||
   ! timeout "$kCompileTimeoutS" cmake --build "$tmp/cmake-build" >>"$tmp/cmake.log" 2>&1; then
  tail -40 "$tmp/cmake.log"; fail cmake "configure or build failed (log above)"
elif ! run_ranks cmake "$tmp/cmake-build/dp_trainer"; then fail cmake "2-rank run failed (logs above)"
elif ! needs_torch_library "$tmp/cmake-build/no_symbols"; then
  fail cmake "no_symbols (linked --as-needed) does not need libcohort_torch.so.$kSoversion or needs libgrpc++: cohort::torch must link it (only it) --no-as-needed"
else pass cmake; fi
echo "install: cmake took $((SECONDS - start)) s"

# --- pkg_config ------------------------------------------------------------------------------
start=$SECONDS
mkdir -p "$tmp/pc-build"
if ! PKG_CONFIG_PATH="$prefix/lib/pkgconfig" timeout "$kCompileTimeoutS" \
       make -s -f tests/install/consumer/Makefile OUT="$tmp/pc-build" >"$tmp/pc.log" 2>&1; then
  tail -40 "$tmp/pc.log"; fail pkg_config "build failed (log above)"
elif ! run_ranks pkg_config "$tmp/pc-build/dp_trainer"; then fail pkg_config "2-rank run failed (logs above)"
elif ! needs_torch_library "$tmp/pc-build/no_symbols"; then
  fail pkg_config "no_symbols (linked --as-needed) does not need libcohort_torch.so.$kSoversion or needs libgrpc++: cohort.pc must link it (only it) --no-as-needed"
else pass pkg_config; fi
echo "install: pkg_config took $((SECONDS - start)) s"

# --- deb -------------------------------------------------------------------------------------
start=$SECONDS
arch=$(dpkg --print-architecture)
deb="$tmp/cohort_${version}_${arch}.deb"
if ! timeout "$kPackageTimeoutS" deploy/package-deb.sh --no-build --out "$tmp" >"$tmp/deb.log" 2>&1 || [[ ! -f "$deb" ]]; then
  tail -30 "$tmp/deb.log"; fail deb "deploy/package-deb.sh failed or made no $deb"
else
  root="$tmp/root"
  dpkg-deb -x "$deb" "$root"
  multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
  problems=()
  for f in etc/cohort/cohortd.yaml lib/systemd/system/cohortd.service "usr/lib/$multiarch/libcohort_torch.so.0" \
           "usr/lib/$multiarch/cmake/cohort/cohortConfig.cmake" "usr/lib/$multiarch/pkgconfig/cohort.pc" \
           usr/include/cohort/worker/comm/bootstrap.h; do
    [[ -e "$root/$f" ]] || problems+=("no /$f")
  done
  grep -q '^ExecStart=/usr/bin/cohortd ' "$root/lib/systemd/system/cohortd.service" || problems+=("unit does not start /usr/bin/cohortd")
  dpkg-deb -f "$deb" Depends | grep -q 'libtorch' || problems+=("Depends lacks libtorch: $(dpkg-deb -f "$deb" Depends)")
  dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles | grep -qx /etc/cohort/cohortd.yaml || problems+=("cohortd.yaml is no conffile")
  # The postinst, run with adduser and getent stubbed (no user exists yet): it must ask for
  # the system users cohort and cohort-job.
  mkdir -p "$tmp/stubs"
  dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./postinst >"$tmp/postinst"
  printf '#!/bin/sh\nexit 2\n' >"$tmp/stubs/getent"
  printf '#!/bin/sh\necho "$*" >>"%s"\n' "$tmp/adduser.calls" >"$tmp/stubs/adduser"
  chmod +x "$tmp/stubs/getent" "$tmp/stubs/adduser" "$tmp/postinst"
  PATH="$tmp/stubs:$PATH" sh "$tmp/postinst" configure || problems+=("postinst configure exited non-zero")
  grep -qE -- '--system .* cohort$' "$tmp/adduser.calls" 2>/dev/null || problems+=("postinst creates no cohort system user")
  grep -qE -- '--system .* cohort-job$' "$tmp/adduser.calls" 2>/dev/null || problems+=("postinst creates no cohort-job user")
  for b in "$root"/usr/bin/*; do
    name=$(basename "$b")
    out=$(LD_LIBRARY_PATH="$root/usr/lib/$multiarch" timeout 10 "$b" --version 2>&1)
    grep -qF "$version" <<<"$out" || problems+=("$name --version: ${out:0:120}")
  done
  if [[ ${#problems[@]} -eq 0 ]]; then pass deb; else fail deb "$(IFS=';'; echo "${problems[*]}")"; fi
fi
echo "install: deb took $((SECONDS - start)) s"

# --- lintian ---------------------------------------------------------------------------------
start=$SECONDS
if [[ ! -f "$deb" ]]; then fail lintian "no .deb to check"
elif ! command -v lintian >/dev/null; then fail lintian "lintian not installed: run deploy/install-deps.sh"
elif ! timeout "$kLintianTimeoutS" lintian --fail-on error "$deb" >"$tmp/lintian.log" 2>&1; then
  cat "$tmp/lintian.log"; fail lintian "errors above"
else
  grep -c '^W:' "$tmp/lintian.log" | xargs -I{} echo "install: lintian: {} warnings (not errors)"
  pass lintian
fi
echo "install: lintian took $((SECONDS - start)) s"

[[ $failures -eq 0 ]]
