#!/bin/bash
# The multi-host harness itself (tests/cluster/lib.sh):
#  - two hosts get their own host names, and only their own addresses (10.213.X.i on eth0);
#  - host-2 reaches host-1's cohortd over the bridge; a partition cuts it off, a heal restores it;
#  - a run that exits normally leaves no namespace, state directory or process behind, even with
#    a SIGSTOPped daemon;
#  - a run SIGKILLed mid-way (no EXIT trap) leaves leftovers that the next cluster_init removes.
set -u
source "$(dirname "$0")/lib.sh"

failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}
readonly READY_TIMEOUT_S=30
# A TCP connect across the bridge answers at once; one to a cut-off host waits for this.
readonly CONNECT_TIMEOUT_S=2

# Starts a 2-host cluster in a child shell that writes "<its id> <daemon pids>" to $2 once ready,
# then waits for $1 (a file) to appear before exiting normally.
start_child() {
  # Its temporary directory lies in ours, so that a SIGKILLed child's is removed with ours.
  TEST_TMPDIR="${CLUSTER_TMP}" bash -c '
    source "$1"
    cluster_init || exit 3
    cluster_start 2 1 || exit 4
    # A stopped daemon ignores SIGTERM: cleanup must still remove it.
    cluster_signal_daemon 2 STOP
    echo "${CLUSTER_ID} ${CLUSTER_DAEMON_PIDS[*]}" > "$3.tmp" && mv "$3.tmp" "$3"
    while [[ ! -e "$2" ]]; do sleep 0.1; done
  ' child "$(dirname "$0")/lib.sh" "$1" "$2" &
  child=$!
}

wait_for_file() {
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  while [[ ! -s "$1" ]] && ((SECONDS < deadline)); do
    kill -0 "${child}" 2> /dev/null || return 1
    sleep 0.1
  done
  [[ -s "$1" ]]
}

# Whether anything of cluster $1 (namespaces, state directory) or any of the pids $2... remains.
leftovers() {
  local id="$1" pid
  shift
  ip netns list | awk '{print $1}' | grep "^${CLUSTER_PREFIX}-${id}-"
  [[ -e "${CLUSTER_RUN_ROOT}/${id}" ]] && echo "${CLUSTER_RUN_ROOT}/${id}"
  # A zombie has left its namespaces; only its new parent (pid 1 here) can reap it.
  for pid in "$@"; do
    [[ -d "/proc/${pid}" && "$(awk '{print $3}' "/proc/${pid}/stat" 2> /dev/null)" != Z ]] && echo "process ${pid}"
  done
}

cluster_init || exit 0

# --- the hosts, their names and addresses, a partition
cluster_start 2 1 || { cluster_dump_logs; exit 1; }
for i in 1 2; do
  name="$(cluster_exec "${i}" hostname)"
  [[ "${name}" == "host-${i}" ]] || fail "host ${i}'s host name is '${name}'"
  addresses="$(cluster_exec "${i}" ip -o -4 addr show | awk '{print $2, $4}' | tr '\n' ' ')"
  [[ "${addresses}" == "lo 127.0.0.1/8 eth0 $(cluster_host_addr "${i}")/24 " ]] ||
    fail "host ${i}'s addresses are '${addresses}'"
done
[[ "$(hostname)" != host-1 ]] || fail "the test's own host name changed"
for i in 1 2; do
  # Signals from cluster_stop_daemon / cluster_signal_daemon must reach cohortd, not a shell.
  comm="$(cat "/proc/${CLUSTER_DAEMON_PIDS[i]}/comm")"
  [[ "${comm}" == cohortd ]] || fail "host ${i}'s daemon pid ${CLUSTER_DAEMON_PIDS[i]} is '${comm}', not cohortd"
done
connect() { cluster_exec 2 timeout "${CONNECT_TIMEOUT_S}" bash -c "echo > /dev/tcp/${CLUSTER_COORDINATOR%:*}/${CLUSTER_COORDINATOR##*:}" 2> /dev/null; }
connect || fail "host-2 cannot reach the coordinator at ${CLUSTER_COORDINATOR}"
cluster_partition 2
connect && fail "host-2 reaches the coordinator while partitioned"
cluster_heal 2
connect || fail "host-2 cannot reach the coordinator after the heal"

# --- a normal exit cleans up
start_child "${CLUSTER_TMP}/go-1" "${CLUSTER_TMP}/ready-1"
if wait_for_file "${CLUSTER_TMP}/ready-1"; then
  read -r -a ready < "${CLUSTER_TMP}/ready-1"
  touch "${CLUSTER_TMP}/go-1"
  wait "${child}"
  left="$(leftovers "${ready[@]}")"
  [[ -z "${left}" ]] || fail "a normal exit left: ${left}"
else
  fail "the first child cluster did not start"
fi

# --- a SIGKILLed run leaves leftovers; the next cluster_init removes them
start_child "${CLUSTER_TMP}/never" "${CLUSTER_TMP}/ready-2"
if wait_for_file "${CLUSTER_TMP}/ready-2"; then
  read -r -a ready < "${CLUSTER_TMP}/ready-2"
  kill -KILL "${child}"
  wait "${child}" 2> /dev/null
  left="$(leftovers "${ready[@]}")"
  [[ -n "${left}" ]] || fail "a SIGKILLed run left nothing to clean (the test proves nothing)"
  cluster_clean_stale
  left="$(leftovers "${ready[@]}")"
  [[ -z "${left}" ]] || fail "cluster_clean_stale left: ${left}"
  # This test's own cluster is alive and must be untouched.
  [[ -n "$(leftovers "${CLUSTER_ID}")" ]] || fail "cluster_clean_stale removed the live cluster ${CLUSTER_ID}"
else
  fail "the second child cluster did not start"
fi

((failed == 0)) || cluster_dump_logs
exit ${failed}
