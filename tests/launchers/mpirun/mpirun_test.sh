#!/bin/bash
# cohort-bench under a real Open MPI mpirun (Debian's openmpi-bin 4.1), 2 ranks on this host:
# - --init file:///... and --init tcp://127.0.0.1:P: the ranks take rank and world size from
#   OMPI_COMM_WORLD_* and meet through the store the URL names; a checked allreduce sweep must
#   finish with 0 wrong elements in every row;
# - --init env:// without MASTER_ADDR: Open MPI gives no address to meet at, so every rank must
#   fail with the message that names both init URLs to pass and an example mpirun line.
# As root (tests and CI run as root) mpirun needs --allow-run-as-root; --oversubscribe lets 2
# ranks run on a machine with fewer free slots.
set -u
bench="${TEST_SRCDIR}/${TEST_WORKSPACE}/bench/cohort-bench"
# Seconds one mpirun may take (about 3 on an idle 2-core machine).
limit=60
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/mpirun-test.XXXXXX")"
groups=()
cleanup() {
  # Each mpirun ran in a process group of its own (setsid): kill whatever is left of it.
  for g in "${groups[@]}"; do kill -KILL -- "-${g}" 2> /dev/null; done
  rm -rf "${tmp}"
}
trap cleanup EXIT
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}
# Nothing from the caller's launcher may leak in: the ranks must find their way with what mpirun gives.
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
for v in $(env | grep -o '^SLURM_[A-Z_]*'); do unset "${v}"; done

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run NAME ARGS...: mpirun -np 2 ARGS, output in ${tmp}/NAME.{out,err}; returns its exit code.
run() {
  local name="$1"
  shift
  setsid timeout -k 5 "${limit}" mpirun --allow-run-as-root --oversubscribe -np 2 "$@" \
    > "${tmp}/${name}.out" 2> "${tmp}/${name}.err" &
  local pid=$!
  groups+=("${pid}")
  wait "${pid}"
  local rc=$?
  echo "--- ${name} (exit ${rc}) stdout:"
  cat "${tmp}/${name}.out"
  echo "--- ${name} stderr:"
  cat "${tmp}/${name}.err"
  return "${rc}"
}

# check_sweep NAME: the table has rows and every row's #wrong is 0.
check_sweep() {
  local name="$1"
  grep -q '^# cohort-bench: allreduce on 2 ranks' "${tmp}/${name}.out" || fail "${name}: no 2-rank table header"
  local rows bad
  rows="$(grep -cE '^ +[0-9]+ ' "${tmp}/${name}.out")"
  bad="$(grep -E '^ +[0-9]+ ' "${tmp}/${name}.out" | awk '$NF != 0' | wc -l)"
  [[ "${rows}" -ge 4 ]] || fail "${name}: ${rows} table rows, expected at least 4"
  [[ "${bad}" -eq 0 ]] || fail "${name}: ${bad} rows with wrong elements"
}

sweep=(--op allreduce -b 8 -e 64K -f 8 --check --timeout 30)

run file "${bench}" --init "file://${tmp}/store" "${sweep[@]}" || fail "mpirun with --init file:// exited $?"
check_sweep file

run tcp "${bench}" --init "tcp://127.0.0.1:$(free_port)" "${sweep[@]}" || fail "mpirun with --init tcp:// exited $?"
check_sweep tcp

if run env "${bench}" --init env:// "${sweep[@]}"; then
  fail "mpirun with --init env:// and no MASTER_ADDR succeeded; it has no address to meet at"
fi
for part in 'INVALID_ARGUMENT: env:// init under mpirun \(OMPI_COMM_WORLD_RANK=[01]\): MASTER_ADDR is not set' \
  'file:///path/on/a/shared/filesystem' 'mpirun -np 2 cohort-bench --init file:///' 'tcp://HOST:PORT' \
  'cohort-bench --init tcp://node1:29500' 'mpirun -x MASTER_ADDR=node1 -x MASTER_PORT=29500'; do
  grep -qE -- "${part}" "${tmp}/env.err" || fail "bare env:// error lacks '${part}'"
done
[[ "$(grep -c 'cohort-bench: INVALID_ARGUMENT: env:// init under mpirun' "${tmp}/env.err")" -ge 1 ]] ||
  fail "no rank printed the env:// error"

[[ ${failed} -eq 0 ]] && echo "PASS: mpirun over file:// and tcp://, and the bare env:// error"
exit ${failed}
