#!/usr/bin/env bash
# Packs the GPU tests that need no CUDA libtorch into DIR, with the shared libraries they load
# except the C library, libstdc++ and NCCL, for a machine that has a GPU but not this project's
# build (Debian's libtorch is CPU-only, so //tests/gpu:torch_cuda_test and distributed_cuda_test
# cannot travel this way). There, DIR/run.sh runs them against that machine's own NCCL
# (libnccl.so.2 from the Python package nvidia-nccl-*, or COHORT_NCCL_LIB_DIR) and prints a
# summary line per test. It also packs //bench:cohort-bench-nolibtorch (cohort-bench without the
# torchrun store client) with UCX's cma module: DIR/bench.sh runs it on device buffers.
#
#   tests/gpu/device_bundle.sh .gpu-bundle        # here: builds with --config=cuda and packs
#   .gpu-bundle/run.sh [OUT_DIR]                 # on the GPU machine: gtest XML goes to OUT_DIR
#   .gpu-bundle/bench.sh                          # on the GPU machine: cohort-bench --device cuda
set -euo pipefail

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
  usage
  [[ $# -eq 1 ]] && exit 0 || exit 2
fi
dir=$1
cd "$(dirname "$0")/../.."

targets=(
  //tests/gpu:device_reduce_test
  //tests/gpu:device_communicators_test
  //tests/gpu:nccl_process_test
  //worker/comm/transport/nccl:nccl_transport_test
)
bench=//bench:cohort-bench-nolibtorch
echo "device_bundle: bazel build --config=cuda ${targets[*]}"
bazel build --config=cuda "${targets[@]}" "$bench" >/dev/null 2>&1 || {
  echo "device_bundle: the cuda build failed; run: bazel build --config=cuda ${targets[*]}" >&2
  exit 1
}

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/bench" "$dir/lib/ucx"
cp -L /usr/lib/x86_64-linux-gnu/ucx/libuct_cma.so.0 "$dir/lib/ucx/"
for target in "${targets[@]}" "$bench"; do
  path=bazel-out/k8-optcuda/bin/${target#//}
  path=${path/://}
  if [[ $target == "$bench" ]]; then cp "$path" "$dir/bench/cohort-bench"; else cp "$path" "$dir/bin/"; fi
  # What the loader resolves here, less what the GPU machine must provide itself.
  ldd "$path" | awk '/=> \// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
      libc.so.* | libm.so.* | libdl.so.* | librt.so.* | libpthread.so.* | ld-linux* | libgcc_s.so.* | libstdc++.so.* | libnccl.so.*) ;;
      *) [[ -e $dir/lib/$(basename "$lib") ]] || cp -L "$lib" "$dir/lib/" ;;
    esac
  done
done

cat >"$dir/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the packed GPU tests; gtest XML results go to ${1:-.}.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-.}
mkdir -p "$out"
nccl=${COHORT_NCCL_LIB_DIR:-}
if [[ -z $nccl ]]; then
  nccl=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0] + "/lib")' 2>/dev/null ||
    dirname "$(find / -xdev -name 'libnccl.so.2' -print -quit 2>/dev/null)")
fi
[[ -e $nccl/libnccl.so.2 ]] || { echo "run.sh: no libnccl.so.2 found; set COHORT_NCCL_LIB_DIR" >&2; exit 1; }
export LD_LIBRARY_PATH=$here/lib:$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "run.sh: NCCL from $nccl"
nvidia-smi -L || true
failed=0
for test in "$here"/bin/*; do
  name=$(basename "$test")
  "$test" --gtest_output="xml:$out/$name.xml" >"$out/$name.log" 2>&1
  rc=$?
  summary=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')
  echo "run.sh: $name rc=$rc $summary"
  [[ $rc -eq 0 ]] || { failed=1; tail -40 "$out/$name.log"; }
done
exit $failed
EOF
cat >"$dir/bench.sh" <<'EOF'
#!/usr/bin/env bash
# cohort-bench on device buffers: NCCL's one-rank path, and the host kinds' staging (1 and 4 ranks
# on GPU 0), every result checked. Extra arguments go to every run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nccl=${COHORT_NCCL_LIB_DIR:-$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0] + "/lib")' 2>/dev/null)}
export LD_LIBRARY_PATH=$here/lib:$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$here/lib/ucx
b=$here/bench/cohort-bench
status=0
for args in "-np 1 --kind pure_nccl" "-np 1 --kind flat" "-np 4 --kind flat"; do
  for op in allreduce broadcast allgather reduce_scatter; do
    echo "== cohort-bench --device cuda $args --op $op --sizes 8,1K,64K,1M,16M,64M,256M --check $*"
    "$b" --device cuda $args --op "$op" --sizes 8,1K,64K,1M,16M,64M,256M --check "$@" || status=1
  done
done
exit $status
EOF
chmod +x "$dir/run.sh" "$dir/bench.sh"
echo "device_bundle: $(du -sh "$dir" | cut -f1) in $dir ($(ls "$dir/bin" | wc -l) tests, $(ls "$dir/lib" | wc -l) libraries)"
