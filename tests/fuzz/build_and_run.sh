#!/usr/bin/env bash
# Builds cohort's libFuzzer targets (tests/fuzz/<target>_fuzzer.cc) with Debian's clang under
# AddressSanitizer and runs each for a bounded time from its seed corpus (tests/data/fuzz/<target>/).
#
#   tests/fuzz/build_and_run.sh                            # every target, 15 s each
#   COHORT_FUZZ_SECONDS=600 tests/fuzz/build_and_run.sh job_spec_yaml
#   tests/fuzz/build_and_run.sh --build-only
#
# Prints one line per target, "fuzz: TARGET: PASSED ..." or "fuzz: TARGET: FAILED ...", which
# tests/run_all.sh counts as one test each; exits non-zero when any target failed. A crash prints
# the reproducer's path and the command that replays it.
#
# How it builds. Bazel's toolchain is gcc and stays so (switching it would rebuild the whole tree
# back and forth). Only the code under test is compiled here, by clang++ with libFuzzer's coverage
# and ASan: the harness and the sources matching the target's pattern below. Everything else the
# fuzzer links is what Bazel already built for the target's library (gcc objects, uninstrumented,
# but their heap still goes through ASan's allocator); `bazel cquery` with cc_info.cquery names
# those objects, the link flags, include directories and defines, so the harness never keeps its
# own copy of the dependency graph.
#
# Caching: objects live in $COHORT_FUZZ_CACHE (default /var/cache/cohort-fuzz as root, else
# ~/.cache/cohort-fuzz), under a directory keyed by the compiler version and flags; an object is
# reused while the hash of its source and every header it included (from its .d file) is unchanged,
# and a fuzzer is relinked only when one of its inputs changed. Inputs the fuzzer finds go to a
# corpus in the cache that grows across runs, never into tests/data.
#
# Environment:
#   COHORT_FUZZ_SECONDS  seconds each target runs (default 15; issue 11 bounds run_all's at 60)
#   COHORT_FUZZ_CACHE    the cache directory
#   COHORT_FUZZ_JOBS     parallel compiles (default 2: the CI machine has two cores)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

# name | Bazel library the harness links | sources (workspace paths, ERE) compiled with coverage
targets_table=(
  "tcp_store_server|//worker/comm/store:tcp_store_service|^worker/comm/store/[a-z_]+\.cc$"
  "wire_format|//worker/comm/store:store_internal|^worker/comm/store/(wire_format|tcp_store_protocol)\.cc$"
  "job_spec_yaml|//client:job_spec_yaml|^client/job_spec_yaml\.cc$"
  "daemon_config|//daemon/server:daemon_config|^daemon/server/daemon_config\.cc$"
)

seconds=${COHORT_FUZZ_SECONDS:-15}
jobs=${COHORT_FUZZ_JOBS:-2}
if [[ $(id -u) -eq 0 ]]; then default_cache=/var/cache/cohort-fuzz; else default_cache=${XDG_CACHE_HOME:-$HOME/.cache}/cohort-fuzz; fi
cache=${COHORT_FUZZ_CACHE:-$default_cache}
build_only=0
selected=()
for arg in "$@"; do
  case "$arg" in
    --build-only) build_only=1 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) selected+=("$arg") ;;
  esac
done

declare -A label_of pattern_of
names=()
for row in "${targets_table[@]}"; do
  IFS='|' read -r name label pattern <<<"$row"
  label_of[$name]=$label pattern_of[$name]=$pattern
  names+=("$name")
done
if [[ ${#selected[@]} -gt 0 ]]; then
  for name in "${selected[@]}"; do
    [[ -n ${label_of[$name]:-} ]] || { echo "fuzz: unknown target '$name'; the targets are ${names[*]}"; exit 2; }
  done
  names=("${selected[@]}")
fi

fail_all() {  # REASON: every selected target fails for one reason (no compiler, no Bazel outputs)
  for name in "${names[@]}"; do echo "fuzz: $name: FAILED ($1)"; done
  exit 1
}

command -v clang++ >/dev/null || fail_all "clang++ not found; deploy/install-deps.sh installs clang"
resource_dir=$(clang++ -print-resource-dir)
compgen -G "$resource_dir/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null ||
  compgen -G "$resource_dir/lib/*/libclang_rt.fuzzer*.a" >/dev/null ||
  fail_all "libFuzzer not found under $resource_dir; deploy/install-deps.sh installs libclang-rt-*-dev"

mkdir -p "$cache" || fail_all "cannot create the cache directory $cache"
exec 9>"$cache/lock"
flock 9  # one build at a time per cache

# The Bazel side: build the libraries (a no-op after run_all's `bazel test //...`), then read what
# linking them takes.
labels=()
for name in "${names[@]}"; do labels+=("${label_of[$name]}"); done
bazel_log=$(mktemp)
scratch=$(mktemp -d)
trap 'rm -rf "$bazel_log" "$scratch"' EXIT
# Every library in the closure, so that no object linked below is stale.
if ! bazel query "kind('cc_library', deps(set(${labels[*]})))" >"$scratch/libraries" 2>"$bazel_log"; then
  cat "$bazel_log"
  fail_all "bazel query for the fuzz targets' libraries failed"
fi
mapfile -t libraries < <(grep '^//' "$scratch/libraries")
if ! bazel build -- "${libraries[@]}" >"$bazel_log" 2>&1; then
  cat "$bazel_log"
  fail_all "bazel build of the fuzz targets' libraries failed"
fi
# The execution root: from the bazel-out symlink the build just refreshed (no second wait for
# Bazel's lock), else from bazel info.
execroot=$(dirname "$(readlink bazel-out 2>/dev/null)")
if [[ ! -d $execroot/bazel-out ]]; then
  execroot=$(bazel info execution_root 2>/dev/null) || fail_all "bazel info execution_root failed"
fi
query_expr="set(${labels[*]})"
if ! bazel cquery "$query_expr" --output=starlark --starlark:file=tests/fuzz/cc_info.cquery \
    >"$scratch/ccinfo" 2>"$bazel_log"; then
  cat "$bazel_log"
  fail_all "bazel cquery for the fuzz targets' libraries failed"
fi

cxx_flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,fuzzer-no-link)
# System headers are left out of the .d files (-MMD), so the versions of the libraries whose headers
# the code includes key the whole cache instead.
toolchain_key=$( { clang++ --version; echo "${cxx_flags[*]}"
  dpkg-query -W libyaml-cpp-dev libprotobuf-dev libfmt-dev libspdlog-dev libgrpc++-dev libssl-dev 2>/dev/null
} | sha256sum | cut -c1-16)
build_dir=$cache/build-$toolchain_key

# hash_inputs DEPFILE: the hash of every file the object was built from (the .d file's list).
hash_inputs() {
  sed -e 's/\\$//' -e 's/^[^:]*://' "$1" | tr ' ' '\n' | sed '/^$/d' | sort -u | xargs -r sha256sum | sha256sum | cut -c1-64
}

# compile_one SOURCE OBJECT FLAGS...: compiles into OBJECT (.d and .key beside it), unless the
# cached object's inputs are unchanged.
compile_one() {
  local source=$1 object=$2; shift 2
  if [[ -f $object && -f $object.d && -f $object.key ]] &&
     [[ $(hash_inputs "$object.d" 2>/dev/null) == "$(cat "$object.key")" ]]; then
    return 0
  fi
  if ! clang++ "$@" -MMD -MF "$object.d" -c "$source" -o "$object.tmp" 2>"$object.log"; then
    echo "fuzz: compiling $source failed:"; cat "$object.log"
    rm -f "$object" "$object.key"
    return 1
  fi
  mv "$object.tmp" "$object"
  sed -i "s#$object.tmp#$object#" "$object.d"
  hash_inputs "$object.d" >"$object.key"
  echo "fuzz: compiled $source"
}
export -f compile_one hash_inputs

all_exist() {  # PATH...: whether every path (relative to the execution root) exists
  local path
  for path in "$@"; do [[ -f $execroot/$path ]] || return 1; done
}

newest() {  # PATH...: the latest modification time (seconds) among the paths
  (cd "$execroot" && stat -c %Y "$@" | sort -n | tail -1)
}

# build_target NAME: leaves $build_dir/NAME/fuzzer, or fails.
build_target() {
  local name=$1 label=${label_of[$1]} pattern=${pattern_of[$1]}
  local dir=$build_dir/$name
  mkdir -p "$dir/obj"
  local -a defines=() includes=() linkopts=() gcc_objects=() sources=("tests/fuzz/${name}_fuzzer.cc")
  local kind value path relative source
  local -a pic_objects=() plain_objects=()
  # add_object OBJECT: compiled here when its source matches the pattern, else linked as built.
  add_object() {
    # bazel-out/CFG/bin/PKG/_objs/LIB/REL.pic.o was compiled from PKG/REL.cc.
    relative=${1#bazel-out/*/bin/}
    source="${relative%%/_objs/*}/${relative#*/_objs/*/}"
    source=${source%.o}; source=${source%.pic}.cc
    if [[ $source =~ $pattern && -f $source ]]; then
      [[ " ${sources[*]} " == *" $source "* ]] || sources+=("$source")
    else
      gcc_objects+=("$execroot/$1")
    fi
  }
  while read -r item_label kind value; do
    [[ $item_label == "$label" || $item_label == "@${label}" || $item_label == "@@${label}" ]] || continue
    case "$kind" in
      define) defines+=("-D$value") ;;
      include)
        if [[ $value == . ]]; then path=$root; else path=$execroot/$value; fi
        [[ -d $path ]] && includes+=("-I$path") ;;
      linkopt) linkopts+=("$value") ;;
      pic_object) pic_objects+=("$value") ;;
      object) plain_objects+=("$value") ;;
      end_library)
        # A set complete on disk; of two, the one Bazel compiled last (the other may be stale:
        # Bazel rebuilds only the variant something asked for).
        local -a chosen=()
        if [[ ${#pic_objects[@]} -gt 0 ]] && all_exist "${pic_objects[@]}" &&
           { ! all_exist "${plain_objects[@]}" || [[ ${#plain_objects[@]} -eq 0 ]] ||
             [[ $(newest "${pic_objects[@]}") -ge $(newest "${plain_objects[@]}") ]]; }; then
          chosen=("${pic_objects[@]}")
        elif all_exist "${plain_objects[@]}"; then
          chosen=("${plain_objects[@]}")
        else
          echo "fuzz: $name: Bazel's objects for ${pic_objects[0]:-${plain_objects[0]}} are missing; run bazel build //... first"
          return 1
        fi
        for path in "${chosen[@]}"; do add_object "$path"; done
        pic_objects=() plain_objects=() ;;
    esac
  done <"$scratch/ccinfo"
  [[ ${#gcc_objects[@]} -gt 0 || ${#sources[@]} -gt 1 ]] || { echo "fuzz: no objects found for $label"; return 1; }

  local -a flags=("${cxx_flags[@]}" -I"$root" "${includes[@]}" "${defines[@]}") harness_flags=(-Wall -Wextra -Werror)
  local -a objects=()
  # One line per compile (paths hold no spaces), COHORT_FUZZ_JOBS at a time.
  local jobs_file=$dir/compile.jobs
  : >"$jobs_file"
  for source in "${sources[@]}"; do
    local object=$dir/obj/${source//\//_}.o
    objects+=("$object")
    local line="$source $object ${flags[*]}"
    [[ $source == tests/fuzz/* ]] && line+=" ${harness_flags[*]}"
    echo "$line" >>"$jobs_file"  # no trailing blank: xargs -L would join the next line
  done
  xargs -P "$jobs" -L 1 bash -c 'compile_one "$@"' _ <"$jobs_file" || return 1

  rm -f "$dir/deps.a.tmp"; ar rcs "$dir/deps.a.tmp" "${gcc_objects[@]}" && mv "$dir/deps.a.tmp" "$dir/deps.a" || return 1
  local link_key
  link_key=$( { cat "${objects[@]}" "${gcc_objects[@]}" | sha256sum; echo "${linkopts[*]}"; } | sha256sum | cut -c1-64)
  if [[ -x $dir/fuzzer && -f $dir/fuzzer.key && $(cat "$dir/fuzzer.key") == "$link_key" ]]; then
    return 0
  fi
  if ! clang++ -fsanitize=address,fuzzer "${objects[@]}" -Wl,--start-group "$dir/deps.a" -Wl,--end-group \
      "${linkopts[@]}" -o "$dir/fuzzer.tmp" >"$dir/link.log" 2>&1; then
    echo "fuzz: linking $name failed:"; cat "$dir/link.log"
    return 1
  fi
  mv "$dir/fuzzer.tmp" "$dir/fuzzer"
  echo "$link_key" >"$dir/fuzzer.key"
  echo "fuzz: linked $name"
}

# run_target NAME: runs the fuzzer for $seconds on the cached corpus plus the seeds.
run_target() {
  local name=$1 fuzzer=$build_dir/$1/fuzzer seeds=$root/tests/data/fuzz/$1
  local corpus=$cache/corpus/$name artifacts=$cache/artifacts/$name log=$build_dir/$1/run.log
  mkdir -p "$corpus" "$artifacts"
  [[ -d $seeds ]] || { echo "fuzz: $name: FAILED (no seed corpus $seeds)"; return 1; }
  local start=$SECONDS rc
  # New inputs go to the first directory only: the cache's corpus, never the seeds.
  "$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$corpus" "$seeds" >"$log" 2>&1
  rc=$?
  local runs
  runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p' "$log" | tail -1)
  if [[ $rc -eq 0 ]]; then
    echo "fuzz: $name: PASSED (${runs:-?} runs in $((SECONDS - start)) s)"
    return 0
  fi
  tail -n 60 "$log"
  local reproducer
  reproducer=$(sed -nE 's/.*Test unit written to (.*)$/\1/p' "$log" | tail -1)
  echo "fuzz: $name: FAILED (exit $rc after $((SECONDS - start)) s; log $log)"
  [[ -n $reproducer ]] && echo "fuzz: $name: reproducer $reproducer; replay: $fuzzer $reproducer"
  return 1
}

failures=0
built=()
for name in "${names[@]}"; do
  build_start=$SECONDS
  if build_target "$name"; then
    built+=("$name")
    echo "fuzz: $name: built in $((SECONDS - build_start)) s"
  else
    echo "fuzz: $name: FAILED (build)"
    failures=$((failures + 1))
  fi
done
if [[ $build_only -eq 1 ]]; then
  for name in "${built[@]}"; do echo "fuzz: $name: PASSED (built $build_dir/$name/fuzzer)"; done
else
  for name in "${built[@]}"; do run_target "$name" || failures=$((failures + 1)); done
fi
[[ $failures -eq 0 ]]
