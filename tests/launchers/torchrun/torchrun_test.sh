#!/bin/bash
# cohort's binaries under a real torchrun (Debian's python3-torch 1.13, through torchrun_py311.py),
# two processes each, in one of torch 1.13's two launch forms:
#   standalone: torchrun --standalone --nproc_per_node 2 --no_python ...      (c10d rendezvous:
#               TORCHELASTIC_USE_AGENT_STORE=False, rank 0 serves cohort's own store)
#   static:     torchrun --nnodes 1 --nproc_per_node 2 --master_port P --no_python ...  (torchrun's
#               agent serves a c10d store on P, TORCHELASTIC_USE_AGENT_STORE=True: every rank
#               joins it through the libtorch layer's C10dStore)
# In each: cohort-worker trains a tiny synthetic spec (rank 0 prints "test accuracy X.XXXX" after
# the last epoch, which only completes if the gradient allreduces ran), and cohort-bench runs a
# checked allreduce sweep (every row must show 0 wrong elements).
set -u
mode="${1:?usage: torchrun_test.sh standalone|static}"
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
worker="${root}/worker/runner/cohort-worker"
bench="${root}/bench/cohort-bench"
torchrun=(/usr/bin/python3 "${root}/tests/launchers/torchrun/torchrun_py311.py")
# Seconds one torchrun run may take (it takes about 10 on an idle 2-core machine).
limit=50
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/torchrun-test.XXXXXX")"
groups=()
cleanup() {
  # Each torchrun ran in a process group of its own (setsid): kill whatever is left of it.
  for g in "${groups[@]}"; do kill -KILL -- "-${g}" 2> /dev/null; done
  rm -rf "${tmp}"
}
trap cleanup EXIT
failed=0
fail() {
  echo "FAIL (${mode}): $*"
  failed=1
}

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

launch_flags() {
  case "${mode}" in
    standalone) echo "--standalone --nproc_per_node 2" ;;
    static) echo "--nnodes 1 --nproc_per_node 2 --master_port $(free_port)" ;;
    *) echo "unknown mode ${mode}" >&2; exit 2 ;;
  esac
}

# run NAME ARGS...: torchrun ... --no_python ARGS, output in ${tmp}/NAME.{out,err}; returns its exit code.
run() {
  local name="$1"
  shift
  # shellcheck disable=SC2046  # launch_flags is a list of flags
  setsid timeout -k 5 "${limit}" "${torchrun[@]}" $(launch_flags) --max_restarts 0 --no_python "$@" \
    > "${tmp}/${name}.out" 2> "${tmp}/${name}.err" &
  local pid=$!
  groups+=("${pid}")
  wait "${pid}"
  local rc=$?
  echo "--- ${name} (${mode}, exit ${rc}) stdout:"
  cat "${tmp}/${name}.out"
  echo "--- ${name} stderr:"
  cat "${tmp}/${name}.err"
  return "${rc}"
}

cp "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/data/specs/tiny_job.pbtxt" "${tmp}/job.pbtxt"

if run worker "${worker}" --job-spec "${tmp}/job.pbtxt" --init env://; then
  grep -Eq '^test accuracy [0-9]\.[0-9]{4}$' "${tmp}/worker.out" || fail "no 'test accuracy X.XXXX' line from rank 0"
  grep -q '^epoch 2/2 ' "${tmp}/worker.out" || fail "no line for epoch 2/2"
else
  fail "torchrun cohort-worker failed"
fi

if run bench "${bench}" --init env:// --op allreduce -b 1K -e 64K -f 8 -n 5 -w 1 --check; then
  # Data rows start with the size in bytes; the last column is #wrong.
  rows="$(grep -Ec '^ *[0-9]+ ' "${tmp}/bench.out")"
  [[ "${rows}" -ge 3 ]] || fail "cohort-bench printed ${rows} rows, expected 3 (1K, 8K, 64K)"
  bad="$(awk '/^ *[0-9]+ / && $NF != "0"' "${tmp}/bench.out")"
  [[ -z "${bad}" ]] || fail "rows with wrong elements: ${bad}"
  grep -q '2 ranks' "${tmp}/bench.out" || fail "cohort-bench's header does not say 2 ranks"
else
  fail "torchrun cohort-bench failed"
fi

grep -h 'Address already in use' "${tmp}"/*.err && fail "a rank tried to serve on torchrun's port"
exit "${failed}"
