#!/bin/bash
# Two real cohort-worker processes (UCX over this machine) joined through a file:// store train a
# tiny synthetic job from a .pbtxt spec: both must exit 0, and rank 0 must end its output with the
# "test accuracy X.XXXX" line the CLI parses. A missing spec must fail with exit 1 and a one-line
# error naming the file.
set -u
bin="${TEST_SRCDIR}/${TEST_WORKSPACE}/worker/runner/cohort-worker"
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/cohort-worker-test.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}

cp "${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/data/specs/tiny_job.pbtxt" "${tmp}/job.pbtxt"

pids=()
for r in 0 1; do
  timeout 120 "${bin}" --job-spec "${tmp}/job.pbtxt" --init "file://${tmp}/store?rank=${r}&world_size=2" \
    > "${tmp}/out.${r}" 2> "${tmp}/err.${r}" &
  pids+=($!)
done
for r in 0 1; do
  wait "${pids[${r}]}"
  rc=$?
  echo "--- rank ${r} (exit ${rc}) stdout:"
  cat "${tmp}/out.${r}"
  echo "--- rank ${r} stderr:"
  cat "${tmp}/err.${r}"
  [[ ${rc} -eq 0 ]] || fail "rank ${r} exited ${rc}"
done
last="$(tail -n 1 "${tmp}/out.0")"
[[ "${last}" =~ ^test\ accuracy\ [0-9]\.[0-9]{4}$ ]] || fail "rank 0's last line is '${last}', not 'test accuracy X.XXXX'"
grep -q '^epoch 2/2 ' "${tmp}/out.0" || fail "rank 0 printed no line for epoch 2/2"
[[ ! -s "${tmp}/out.1" ]] || fail "rank 1 printed progress (only rank 0 should)"

"${bin}" --job-spec "${tmp}/missing.pbtxt" --init "file://${tmp}/store2?rank=0&world_size=1" \
  > /dev/null 2> "${tmp}/err.missing"
rc=$?
[[ ${rc} -eq 1 ]] || fail "a missing spec exited ${rc}, not 1"
grep -q 'cohort-worker: NOT_FOUND: job spec .*missing.pbtxt' "${tmp}/err.missing" || {
  cat "${tmp}/err.missing"
  fail "a missing spec's error does not name the file"
}
exit ${failed}
