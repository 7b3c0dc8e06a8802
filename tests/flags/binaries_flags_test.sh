#!/bin/bash
# Each binary: --help exits 0 and starts with "usage: <name>" and lists its options; --version exits
# 0 and starts with "<name> "; an unknown option, a missing value and a bad number each exit 2 with
# "<name>: " and a pointer to --help on stderr, and print no help to stdout. Env fallbacks are
# checked where a binary has them (cohort-worker's COHORT_JOB_SPEC).
set -u
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/flags.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}

# check NAME PATH NUMERIC_OPTION: the shared shape.
check() {
  local name="$1" bin="${root}/$2" numeric="$3" rc
  timeout 20 "${bin}" --help > "${tmp}/out" 2> "${tmp}/err"
  rc=$?
  [[ ${rc} -eq 0 ]] || fail "${name} --help exited ${rc}"
  [[ "$(head -n 1 "${tmp}/out")" == "usage: ${name} "* ]] || fail "${name} --help starts '$(head -n 1 "${tmp}/out")'"
  grep -q '^options:$' "${tmp}/out" || fail "${name} --help has no 'options:' section"
  grep -q -- '--version' "${tmp}/out" || fail "${name} --help does not list --version"

  timeout 20 "${bin}" --version > "${tmp}/out" 2> "${tmp}/err"
  rc=$?
  [[ ${rc} -eq 0 ]] || fail "${name} --version exited ${rc}"
  [[ "$(head -n 1 "${tmp}/out")" == "${name} "[0-9]* ]] || fail "${name} --version printed '$(cat "${tmp}/out")'"

  local args
  for args in "--no-such-flag" "${numeric}" "${numeric} not-a-number"; do
    # shellcheck disable=SC2086  # the cases are words on purpose
    timeout 20 "${bin}" ${args} > "${tmp}/out" 2> "${tmp}/err"
    rc=$?
    [[ ${rc} -eq 2 ]] || fail "${name} ${args} exited ${rc}, not 2"
    [[ "$(head -n 1 "${tmp}/err")" == "${name}: "* ]] || fail "${name} ${args}: stderr '$(head -n 1 "${tmp}/err")'"
    grep -q -- "run '${name} --help'" "${tmp}/err" || fail "${name} ${args}: no pointer to --help"
    [[ ! -s "${tmp}/out" ]] || fail "${name} ${args} printed to stdout: $(head -n 3 "${tmp}/out")"
  done
  grep -q -- "${numeric}" "${tmp}/err" || fail "${name}: the bad-number error does not name ${numeric}: $(cat "${tmp}/err")"
}

check cohortd daemon/cohortd --slots
check cohort-worker worker/runner/cohort-worker --no-numeric-flag
check cohort-store worker/comm/store/cohort-store --listen
check cohort-bench bench/cohort-bench -n
check train_fashion_mnist bench/train_fashion_mnist --epochs
check train_mnist_dp worker/examples/train_mnist_dp --max-steps
check train_mlp_model_parallel worker/examples/train_mlp_model_parallel --limit
check train_vgg_parallel_conv worker/examples/train_vgg_parallel_conv --ranks
check mpi_baseline bench/mpi_baseline -n
check memcpy_bandwidth bench/memcpy_bandwidth -n

# cohortd: a bad value caught after parsing (the settings table) is a usage error too.
timeout 20 "${root}/daemon/cohortd" --role all --data-dir "${tmp}/d" --slots 0 > /dev/null 2> "${tmp}/err"
rc=$?
[[ ${rc} -eq 2 ]] || fail "cohortd --slots 0 exited ${rc}"
grep -q -- '--slots' "${tmp}/err" || fail "cohortd --slots 0: $(cat "${tmp}/err")"

# An unknown COHORT_LOG_LEVEL is a usage error naming the variable, the value and every accepted
# level (issue 15: it used to turn logging off silently).
for bin in daemon/cohortd worker/runner/cohort-worker bench/cohort-bench; do
  name="$(basename "${bin}")"
  args=()
  case "${name}" in
    cohortd) args=(--role all --data-dir "${tmp}/loglevel" --listen 127.0.0.1:0) ;;
    cohort-worker) args=(--init env://) ;;
    cohort-bench) args=(-np 1) ;;
  esac
  COHORT_LOG_LEVEL=loud timeout 20 "${root}/${bin}" "${args[@]}" > "${tmp}/out" 2> "${tmp}/err"
  rc=$?
  [[ ${rc} -eq 2 ]] || fail "${name} with COHORT_LOG_LEVEL=loud exited ${rc}, not 2: $(head -n 3 "${tmp}/err")"
  [[ "$(head -n 1 "${tmp}/err")" == "${name}: "*"COHORT_LOG_LEVEL=loud"* ]] ||
    fail "${name}: the COHORT_LOG_LEVEL error does not name the variable and value: $(head -n 1 "${tmp}/err")"
  grep -q "trace, debug, info, warn, error, critical, off" "${tmp}/err" ||
    fail "${name}: the COHORT_LOG_LEVEL error does not list the accepted levels: $(cat "${tmp}/err")"
done

# cohort-bench keeps mpirun's -np spelling.
timeout 20 "${root}/bench/cohort-bench" -np 0 > /dev/null 2> "${tmp}/err"
rc=$?
[[ ${rc} -eq 2 ]] || fail "cohort-bench -np 0 exited ${rc}"
grep -q -- '--np' "${tmp}/err" || fail "cohort-bench -np 0: $(cat "${tmp}/err")"

# cohort-worker: --job-spec falls back to COHORT_JOB_SPEC (a flag wins).
COHORT_JOB_SPEC="${tmp}/from-env.yaml" timeout 20 "${root}/worker/runner/cohort-worker" --init env:// \
  > /dev/null 2> "${tmp}/err"
grep -q 'from-env.yaml' "${tmp}/err" || fail "cohort-worker did not read COHORT_JOB_SPEC: $(cat "${tmp}/err")"
COHORT_JOB_SPEC="${tmp}/from-env.yaml" timeout 20 "${root}/worker/runner/cohort-worker" --init env:// \
  --job-spec "${tmp}/from-flag.yaml" > /dev/null 2> "${tmp}/err"
grep -q 'from-flag.yaml' "${tmp}/err" || fail "cohort-worker: --job-spec did not win over COHORT_JOB_SPEC: $(cat "${tmp}/err")"

exit ${failed}
