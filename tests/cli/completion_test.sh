#!/usr/bin/env bash
# `cohort completion bash`, sourced in bash, completes commands, options, values and job ids against
# a live coordinator; and the CLI's other issue-15 behaviour on that coordinator: list --watch ends
# with 0 on Ctrl-C (SIGINT), -o yaml and -o wide, --set, and the exit codes (1 call failed, 2 usage,
# 3 job FAILED under --follow and wait). About 15 s.

set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/live_daemon.sh"
live_daemon_start || exit 1

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# Runs the completion function on a command line given as words (the last one is completed).
complete_line() {
  COMP_WORDS=("$@")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMP_LINE="$*"
  COMPREPLY=()
  _cohort
  echo "${COMPREPLY[*]}"
}
expect_completion() {
  local expected="$1"
  shift
  local got
  got="$(complete_line "$@")"
  [[ "${got}" == "${expected}" ]] || fail "completing '$*': expected '${expected}', got '${got}'"
}
job_id_of() { sed -n 's/.*"job_id": "\([^"]*\)".*/\1/p'; }

# Two quick jobs to complete ids of; --set names the second (and checks that --set applies).
ok_job="$(live_command_job alpha /bin/true)"
alpha="$(cohort submit "${ok_job}" -o json | job_id_of)"
beta="$(cohort submit "${ok_job}" --set name=beta -o json | job_id_of)"
[[ "${alpha}" == alpha-* ]] || fail "first job id '${alpha}' is not alpha-N"
[[ "${beta}" == beta-* ]] || fail "--set name=beta gave job id '${beta}'"

# ---- completion -----------------------------------------------------------------------------------
script="${LIVE_TMP}/cohort.bash"
cohort completion bash > "${script}"
# shellcheck source=/dev/null
source "${script}"
complete -p cohort | grep -q -- '-F _cohort' || fail "complete -p cohort does not name _cohort"
expect_completion "submit" cohort su
expect_completion "status" cohort --coordinator "${COHORT_COORDINATOR}" sta
expect_completion "--follow" cohort submit --fo
expect_completion "--watch" cohort list --wat
expect_completion "yaml" cohort list -o y
expect_completion "running" cohort list --state ru
expect_completion "add" cohort user ad
expect_completion "bash" cohort completion b
expect_completion "${alpha}" cohort status al
expect_completion "${beta}" cohort logs -f b
expect_completion "${alpha} ${beta}" cohort wait ""
# The ids come from the coordinator on the line: a dead one completes nothing, quietly.
expect_completion "" cohort --coordinator 127.0.0.1:1 cancel al

# ---- exit codes and waiting -------------------------------------------------------------------------
rc=0
cohort wait "${alpha}" --timeout 60 > "${LIVE_TMP}/wait.out" || rc=$?
[[ ${rc} -eq 0 ]] || fail "cohort wait on a succeeding job exited ${rc}: $(cat "${LIVE_TMP}/wait.out")"
grep -q "SUCCEEDED" "${LIVE_TMP}/wait.out" || fail "cohort wait did not print SUCCEEDED"
bad_job="$(live_command_job failing /bin/false)"
rc=0
cohort submit "${bad_job}" --follow > "${LIVE_TMP}/follow.out" 2>&1 || rc=$?
[[ ${rc} -eq 3 ]] || fail "submit --follow of a failing job exited ${rc}, not 3: $(cat "${LIVE_TMP}/follow.out")"
failing="$(sed -n 's/^submitted job //p' "${LIVE_TMP}/follow.out")"
rc=0
cohort wait "${failing}" > /dev/null || rc=$?
[[ ${rc} -eq 3 ]] || fail "cohort wait on the FAILED job ${failing} exited ${rc}, not 3"
rc=0
cohort status no-such-job-1 2> "${LIVE_TMP}/err" || rc=$?
[[ ${rc} -eq 1 ]] || fail "status of an unknown job exited ${rc}, not 1: $(cat "${LIVE_TMP}/err")"
rc=0
cohort status "${alpha}" --bogus 2> "${LIVE_TMP}/err" || rc=$?
[[ ${rc} -eq 2 ]] || fail "an unknown option exited ${rc}, not 2"
grep -q -- "--bogus" "${LIVE_TMP}/err" || fail "the usage error does not name --bogus: $(cat "${LIVE_TMP}/err")"
rc=0
cohort submit "${ok_job}" --set epochs=many 2> "${LIVE_TMP}/err" || rc=$?
[[ ${rc} -eq 2 ]] || fail "--set epochs=many exited ${rc}, not 2"
grep -q "epochs: 'many' is not a whole number" "${LIVE_TMP}/err" || fail "--set error: $(cat "${LIVE_TMP}/err")"

# ---- output formats -------------------------------------------------------------------------------
cohort list -o yaml | grep -q "^  - id: ${alpha}$" || fail "cohort list -o yaml has no '- id: ${alpha}': $(cohort list -o yaml | head -5)"
cohort list -o wide | head -1 | grep -q "NAME  *OWNER" || fail "cohort list -o wide has no NAME/OWNER columns"
cohort status "${alpha}" -o wide | grep -q "^owner  *admin" || fail "cohort status -o wide has no owner row"
cohort nodes -o wide | head -1 | grep -q "HOSTNAME" || fail "cohort nodes -o wide has no HOSTNAME column"
cohort status "${alpha}" -o yaml | grep -q "^state: SUCCEEDED$" || fail "cohort status -o yaml: $(cohort status "${alpha}" -o yaml | head -5)"

# ---- list --watch: prints, then Ctrl-C (SIGINT) ends it with 0 ------------------------------------
rc=0
timeout --preserve-status -s INT 3 cohort list --watch > "${LIVE_TMP}/watch.out" 2>&1 || rc=$?
[[ ${rc} -eq 0 ]] || fail "cohort list --watch ended by SIGINT exited ${rc}, not 0"
grep -q "${beta}" "${LIVE_TMP}/watch.out" || fail "cohort list --watch printed no ${beta}: $(cat "${LIVE_TMP}/watch.out")"
# A new job while watching: the list is printed again with it (not a terminal: appended).
timeout --preserve-status -s INT 8 cohort list --watch -o json > "${LIVE_TMP}/watch2.out" 2>&1 &
watcher=$!
sleep 1.5
gamma="$(cohort submit "${ok_job}" --set name=gamma -o json | job_id_of)"
rc=0
wait "${watcher}" || rc=$?
[[ ${rc} -eq 0 ]] || fail "the second watch exited ${rc}"
grep -q "\"id\": \"${gamma}\"" "${LIVE_TMP}/watch2.out" || fail "the watch did not show ${gamma}, submitted while it ran"
[[ $(grep -c '"jobs"' "${LIVE_TMP}/watch2.out") -ge 2 ]] || fail "the watch printed the list only once"

if ((failures > 0)); then
  live_daemon_log 30
  echo "${failures} check(s) failed"
  exit 1
fi
echo "PASS: completion, list --watch, -o yaml/wide, --set and exit codes"
