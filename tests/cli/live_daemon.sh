#!/usr/bin/env bash
# A live one-node cohort cluster for shell tests of the `cohort` CLI: one real cohortd --role all
# (coordinator and agent) on 127.0.0.1, port 0, TLS and the admin's credentials file it writes at
# first start, cohort-worker for graph jobs. Source it, then call live_daemon_start; it exports
# COHORT_COORDINATOR and COHORT_CREDENTIALS (so a plain `cohort ...` talks to it, as a user's
# would) and puts `cohort` first on PATH. Everything lives in one temporary directory; the daemon
# is stopped (TERM, then KILL) and the directory removed on exit.
#
#   source "$(dirname "$0")/live_daemon.sh"
#   live_daemon_start || exit 1
#   id=$(cohort submit job.yaml -o json | sed -n 's/.*"job_id": "\(.*\)".*/\1/p')
#
# Binaries: $COHORTD, $COHORT_CLI and $COHORT_WORKER, else the Bazel runfiles of //daemon:cohortd,
# //client:cohort and //worker/runner:cohort-worker, else bazel-bin.

set -euo pipefail

# How long cohortd may take to print "listening on", and its agent to register.
LIVE_START_TIMEOUT_S=30
LIVE_DAEMON_PID=""
LIVE_TMP=""

_live_runfile() {
  local path="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-_main}/$1"
  [[ -x "${path}" ]] || path="$(dirname "${BASH_SOURCE[0]}")/../../bazel-bin/$1"
  echo "${path}"
}

live_daemon_cleanup() {
  if [[ -n "${LIVE_DAEMON_PID}" ]] && kill -0 "${LIVE_DAEMON_PID}" 2> /dev/null; then
    kill -TERM "${LIVE_DAEMON_PID}" 2> /dev/null || true
    local deadline=$((SECONDS + 10))
    while kill -0 "${LIVE_DAEMON_PID}" 2> /dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "${LIVE_DAEMON_PID}" 2> /dev/null || true
    wait "${LIVE_DAEMON_PID}" 2> /dev/null || true
  fi
  LIVE_DAEMON_PID=""
  [[ -z "${LIVE_TMP}" ]] || rm -rf "${LIVE_TMP}"
}

# The daemon's log, for a failing test's output.
live_daemon_log() { tail -n "${1:-40}" "${LIVE_TMP}/cohortd.log" >&2 || true; }

live_daemon_start() {
  COHORTD="${COHORTD:-$(_live_runfile daemon/cohortd)}"
  COHORT_CLI="${COHORT_CLI:-$(_live_runfile client/cohort)}"
  COHORT_WORKER="${COHORT_WORKER:-$(_live_runfile worker/runner/cohort-worker)}"
  local tool
  for tool in "${COHORTD}" "${COHORT_CLI}" "${COHORT_WORKER}"; do
    [[ -x "${tool}" ]] || { echo "FAIL: ${tool} is not built" >&2; return 1; }
  done
  LIVE_TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/cohort-cli.XXXXXX")"
  # The job user (cohort-job when run as root) only traverses it, to reach its working directory.
  chmod 0711 "${LIVE_TMP}"
  trap 'live_daemon_cleanup' EXIT
  trap 'exit 130' INT TERM
  mkdir -p "${LIVE_TMP}/bin" "${LIVE_TMP}/data"
  chmod 0711 "${LIVE_TMP}/data"
  ln -s "$(readlink -f "${COHORT_CLI}")" "${LIVE_TMP}/bin/cohort"
  export PATH="${LIVE_TMP}/bin:${PATH}"
  # exec: $! is cohortd itself, so the signals above reach it.
  (exec "${COHORTD}" --role all --listen 127.0.0.1:0 --slots 2 --worker "${COHORT_WORKER}" \
    --data-dir "${LIVE_TMP}/data" > "${LIVE_TMP}/cohortd.log" 2>&1) &
  LIVE_DAEMON_PID=$!
  local deadline=$((SECONDS + LIVE_START_TIMEOUT_S)) address=""
  while ((SECONDS < deadline)); do
    address="$(sed -n 's/^listening on //p' "${LIVE_TMP}/cohortd.log" | tail -n 1)"
    [[ -z "${address}" ]] || break
    kill -0 "${LIVE_DAEMON_PID}" 2> /dev/null || break
    sleep 0.2
  done
  if [[ -z "${address}" ]]; then
    echo "FAIL: cohortd did not start; its log:" >&2
    live_daemon_log
    return 1
  fi
  export COHORT_COORDINATOR="${address}"
  export COHORT_CREDENTIALS="${LIVE_TMP}/data/admin.credentials"
  # Wait for the agent to register, so a job is placed at once.
  while ((SECONDS < deadline)); do
    if cohort nodes -o json 2> /dev/null | grep -q '"node_id"'; then return 0; fi
    sleep 0.2
  done
  echo "FAIL: cohortd's agent did not register within ${LIVE_START_TIMEOUT_S}s; its log:" >&2
  live_daemon_log
  return 1
}

# A command job's YAML file `name`.yaml in the temporary directory running `command...`; prints its path.
live_command_job() {
  local name="$1"
  shift
  local path="${LIVE_TMP}/${name}.yaml" words=""
  local word
  for word in "$@"; do words+="${words:+, }\"${word}\""; done
  printf 'name: %s\nnodes: 1\nprocs_per_node: 1\ncommand: [%s]\nrestart_policy: {max_restarts: 0}\n' \
    "${name}" "${words}" > "${path}"
  echo "${path}"
}
