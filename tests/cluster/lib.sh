# shellcheck shell=bash
# A multi-host cohort cluster on one machine, for tests (issue 16): N simulated hosts, each a
# network namespace with its own host name (a UTS namespace) and its own address, one cohortd per
# host. Source this file from a bash test that runs as root.
#
#   source tests/cluster/lib.sh
#   cluster_init || exit 0                 # prints SKIP and returns 1 where namespaces are refused
#   cluster_start 3 1                      # 3 hosts, 1 slot each: coordinator+agent on host 1
#   id=$(cluster_submit job.yaml)
#   cluster_wait_job "${id}" SUCCEEDED 60
#   cluster_partition 3; ...; cluster_heal 3
#   (cleanup runs on EXIT by itself)
#
# Topology: a hub namespace holds a bridge (br0, 10.213.X.254/24); host i's namespace holds eth0
# (10.213.X.i/24), a veth whose other end (h<i>) sits on the bridge. Links are created inside the
# namespaces only, so the root namespace never sees a link or an address of the test, and deleting
# the namespaces deletes every link. X is random and checked unused by this machine. The test acts
# as the cluster's admin from the hub namespace, with the admin.credentials file the coordinator
# wrote; a partition takes h<i> down (the host keeps its address, its packets go nowhere), a heal
# brings it back up.
#
# Every name carries the owner's id (its pid): namespaces cohortct-<id>-hub and cohortct-<id>-h<i>,
# state in /run/cohort-cluster/<id> (the owner's pid and start time, and the persistent UTS
# namespaces h<i>.uts). cluster_cleanup kills every process in the cluster's namespaces and deletes
# them; an EXIT trap runs it whatever happens, and cluster_init first removes what a crashed run
# left behind (an id whose owner no longer lives).
#
# Binaries: $COHORTD, $COHORT_CLI and $COHORT_WORKER, else the Bazel runfiles of //daemon:cohortd,
# //client:cohort and //worker/runner:cohort-worker. Needs iproute2 (ip), util-linux (unshare,
# nsenter) and jq.

# Bazel's test PATH may leave out the sbin directories (ip, and hostname on some systems).
PATH="${PATH}:/usr/sbin:/sbin"

readonly CLUSTER_PREFIX="cohortct"
readonly CLUSTER_RUN_ROOT="/run/cohort-cluster"
# How long a cohortd may take to print "listening on", and nodes to register.
readonly CLUSTER_START_TIMEOUT_S=30
# How long cleanup waits after SIGTERM before SIGKILL, and after SIGKILL for processes to go.
readonly CLUSTER_TERM_GRACE_S=3
readonly CLUSTER_KILL_WAIT_S=5
readonly CLUSTER_POLL_S=0.2
# UCX transports and devices of every worker (see cluster_start_daemon); override before starting.
CLUSTER_UCX_TLS="${CLUSTER_UCX_TLS:-tcp}"
CLUSTER_UCX_NET_DEVICES="${CLUSTER_UCX_NET_DEVICES:-eth0}"

CLUSTER_ID=""
CLUSTER_SUBNET=""     # "10.213.X"
# shellcheck disable=SC2034  # for tests: how many hosts cluster_create_hosts made
CLUSTER_HOSTS=0
CLUSTER_TMP=""        # logs and data directories
CLUSTER_CREDENTIALS=""
CLUSTER_COORDINATOR="" # host:port of the coordinator on host 1
CLUSTER_LAST_ADDRESS="" # set by cluster_start_daemon
declare -a CLUSTER_DAEMON_PIDS=()
# What each host's cohortd was started with, for cluster_restart_daemon: its flags (printf %q
# quoted) and the address it listens on.
declare -a CLUSTER_DAEMON_ARGS=()
declare -a CLUSTER_DAEMON_ADDRESSES=()

cluster_log() { echo "[cluster $(date +%T.%3N)] $*" >&2; }

_cluster_runfile() {
  local path="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-_main}/$1"
  [[ -x "${path}" ]] || path="$(dirname "${BASH_SOURCE[0]}")/../../bazel-bin/$1"
  readlink -f "${path}"
}

# "<pid> <start time>" of a process: a pid alone could be reused by another process later.
_cluster_identity() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  # Field 22 of /proc/PID/stat (start time) is the 20th after the command name.
  echo "$1 $(echo "${stat}" | awk '{print $20}')"
}

_cluster_namespaces_of() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^${CLUSTER_PREFIX}-$1-" || true; }

# Removes everything of cluster `id`: processes in its namespaces (TERM, then KILL), the namespaces
# with their links, the UTS namespace mounts, the state directory. Idempotent.
_cluster_teardown_id() {
  local id="$1" ns pid deadline
  local -a namespaces pids
  mapfile -t namespaces < <(_cluster_namespaces_of "${id}")
  _cluster_pids() {
    for ns in "${namespaces[@]}"; do ip netns pids "${ns}" 2>/dev/null; done
  }
  mapfile -t pids < <(_cluster_pids)
  if ((${#pids[@]} > 0)); then
    kill -TERM "${pids[@]}" 2>/dev/null
    deadline=$((SECONDS + CLUSTER_TERM_GRACE_S))
    while ((SECONDS < deadline)); do
      mapfile -t pids < <(_cluster_pids)
      ((${#pids[@]} == 0)) && break
      sleep "${CLUSTER_POLL_S}"
    done
    deadline=$((SECONDS + CLUSTER_KILL_WAIT_S))
    while ((SECONDS < deadline)); do
      mapfile -t pids < <(_cluster_pids)
      ((${#pids[@]} == 0)) && break
      kill -KILL "${pids[@]}" 2>/dev/null
      sleep "${CLUSTER_POLL_S}"
    done
    ((${#pids[@]} == 0)) || cluster_log "processes survived SIGKILL in cluster ${id}: ${pids[*]}"
  fi
  for ns in "${namespaces[@]}"; do ip netns delete "${ns}" 2>/dev/null || cluster_log "cannot delete namespace ${ns}"; done
  local dir="${CLUSTER_RUN_ROOT}/${id}" uts
  if [[ -d "${dir}" ]]; then
    for uts in "${dir}"/*.uts; do
      [[ -e "${uts}" ]] || continue
      umount "${uts}" 2>/dev/null
      rm -f "${uts}"
    done
    rm -rf "${dir}"
  fi
}

# Tears down clusters whose owner is gone (a crashed or killed run), found by their namespaces and
# state directories.
cluster_clean_stale() {
  local -A ids=()
  local ns dir id owner
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${CLUSTER_PREFIX}-"); do
    id="${ns#"${CLUSTER_PREFIX}"-}"
    ids["${id%%-*}"]=1
  done
  for dir in "${CLUSTER_RUN_ROOT}"/*; do
    [[ -d "${dir}" ]] && ids["$(basename "${dir}")"]=1
  done
  for id in "${!ids[@]}"; do
    [[ "${id}" == "${CLUSTER_ID}" ]] && continue
    owner="$(cat "${CLUSTER_RUN_ROOT}/${id}/owner" 2>/dev/null)"
    if [[ -n "${owner}" && "$(_cluster_identity "${owner%% *}")" == "${owner}" ]]; then
      continue # its owner still runs
    fi
    if [[ -z "${owner}" && -d "/proc/${id}" ]]; then
      continue # being created right now (the owner file comes first, but be safe)
    fi
    cluster_log "removing the leftovers of cluster ${id} (its owner is gone)"
    _cluster_teardown_id "${id}"
  done
}

cluster_cleanup() {
  [[ -n "${CLUSTER_ID}" ]] || return 0
  cluster_log "cleaning up cluster ${CLUSTER_ID}"
  _cluster_teardown_id "${CLUSTER_ID}"
}

# Prints the last lines of every daemon's log (call on failure).
cluster_dump_logs() {
  local log
  for log in "${CLUSTER_TMP}"/cohortd-*.log; do
    [[ -e "${log}" ]] || continue
    echo "----- ${log} (last 40 lines)"
    tail -n 40 "${log}"
  done
}

# Prints "SKIP: <why>" and, under `bazel test`, writes the test's XML result as one skipped case, so
# that tests/run_all.sh counts the target as skipped rather than passed.
_cluster_skip() {
  echo "SKIP: $*"
  [[ -n ${XML_OUTPUT_FILE:-} ]] || return 0
  local name="${TEST_TARGET:-cluster_test}" why="$*"
  why="${why//[<>&\"]/}"  # the reasons are plain words; no XML escaping needed once these are gone
  printf '<?xml version="1.0" encoding="UTF-8"?>\n<testsuites><testsuite name="%s" tests="1" skipped="1">\n<testcase name="%s" result="skipped"><skipped message="%s"/></testcase>\n</testsuite></testsuites>\n' \
    "${name}" "${name}" "${why}" > "${XML_OUTPUT_FILE}"
}

# Checks the tools and privileges, removes stale clusters and sets up the EXIT trap. Returns 1 after
# printing "SKIP: ..." where this machine cannot make namespaces (not root, no CAP_SYS_ADMIN).
cluster_init() {
  local tool
  for tool in ip unshare nsenter jq; do
    if ! command -v "${tool}" > /dev/null; then
      _cluster_skip "${tool} is not installed (deploy/install-deps.sh installs it)"
      return 1
    fi
  done
  if [[ $(id -u) -ne 0 ]]; then
    _cluster_skip "the cluster tests make network namespaces and need root"
    return 1
  fi
  COHORTD="${COHORTD:-$(_cluster_runfile daemon/cohortd)}"
  COHORT_CLI="${COHORT_CLI:-$(_cluster_runfile client/cohort)}"
  COHORT_WORKER="${COHORT_WORKER:-$(_cluster_runfile worker/runner/cohort-worker)}"
  for tool in "${COHORTD}" "${COHORT_CLI}" "${COHORT_WORKER}"; do
    [[ -x "${tool}" ]] || { echo "FAIL: ${tool} is not built"; exit 1; }
  done
  CLUSTER_ID="$$"
  mkdir -p "${CLUSTER_RUN_ROOT}"
  cluster_clean_stale
  local probe="${CLUSTER_PREFIX}-${CLUSTER_ID}-probe"
  if ! ip netns add "${probe}" 2> /dev/null; then
    _cluster_skip "this machine refuses network namespaces (ip netns add failed)"
    CLUSTER_ID=""
    return 1
  fi
  ip netns delete "${probe}"
  mkdir -p "${CLUSTER_RUN_ROOT}/${CLUSTER_ID}"
  _cluster_identity "$$" > "${CLUSTER_RUN_ROOT}/${CLUSTER_ID}/owner"
  CLUSTER_TMP="$(mktemp -d "${TEST_TMPDIR:-/tmp}/cohort-cluster.XXXXXX")"
  # The job user (cohort-job) only traverses it, to reach its working directory.
  chmod 0711 "${CLUSTER_TMP}"
  trap 'cluster_cleanup; rm -rf "${CLUSTER_TMP}"' EXIT
  trap 'exit 130' INT TERM
  return 0
}

# A 10.213.X.0/24 that no address or route of this machine uses.
_cluster_pick_subnet() {
  local x used
  used="$(ip -o addr show; ip route show)"
  for _ in $(seq 1 50); do
    x=$((RANDOM % 250 + 1))
    grep -q "10\.213\.${x}\." <<< "${used}" || { echo "10.213.${x}"; return 0; }
  done
  echo "no free 10.213.X.0/24 after 50 tries" >&2
  return 1
}

cluster_hub_ns() { echo "${CLUSTER_PREFIX}-${CLUSTER_ID}-hub"; }
cluster_host_ns() { echo "${CLUSTER_PREFIX}-${CLUSTER_ID}-h$1"; }
cluster_host_name() { echo "host-$1"; }
cluster_host_addr() { echo "${CLUSTER_SUBNET}.$1"; }
_cluster_uts() { echo "${CLUSTER_RUN_ROOT}/${CLUSTER_ID}/h$1.uts"; }

# Makes the hub and `count` hosts (no daemons yet).
cluster_create_hosts() {
  local count="$1" i hub host
  CLUSTER_SUBNET="$(_cluster_pick_subnet)" || return 1
  # shellcheck disable=SC2034  # for tests
  CLUSTER_HOSTS="${count}"
  hub="$(cluster_hub_ns)"
  ip netns add "${hub}" || return 1
  ip -n "${hub}" link set lo up
  ip -n "${hub}" link add br0 type bridge || return 1
  ip -n "${hub}" addr add "${CLUSTER_SUBNET}.254/24" dev br0
  ip -n "${hub}" link set br0 up
  for ((i = 1; i <= count; i++)); do
    host="$(cluster_host_ns "${i}")"
    ip netns add "${host}" || return 1
    ip -n "${host}" link set lo up
    ip -n "${hub}" link add "h${i}" type veth peer name eth0 netns "${host}" || return 1
    ip -n "${hub}" link set "h${i}" master br0 up
    ip -n "${host}" addr add "$(cluster_host_addr "${i}")/24" dev eth0
    ip -n "${host}" link set eth0 up
    touch "$(_cluster_uts "${i}")"
    unshare --uts="$(_cluster_uts "${i}")" hostname "$(cluster_host_name "${i}")" || return 1
  done
  cluster_log "made ${count} hosts on ${CLUSTER_SUBNET}.0/24 (cluster ${CLUSTER_ID})"
}

# Runs a command on host i: in its network and UTS namespaces.
cluster_exec() {
  local i="$1"
  shift
  ip netns exec "$(cluster_host_ns "${i}")" nsenter --uts="$(_cluster_uts "${i}")" -- "$@"
}

# The command names (comm) of the processes in host i's network namespace, one a line.
cluster_ps() {
  local pid
  for pid in $(ip netns pids "$(cluster_host_ns "$1")"); do cat "/proc/${pid}/comm" 2> /dev/null; done
}

# The cohort CLI as the cluster's admin, from the hub namespace.
cluster_cli() { ip netns exec "$(cluster_hub_ns)" "${COHORT_CLI}" --credentials "${CLUSTER_CREDENTIALS}" "$@"; }

# Starts cohortd on host i with the given flags (--data-dir and --listen are set here); waits for
# "listening on HOST:PORT" and sets CLUSTER_LAST_ADDRESS to HOST:PORT. Not in $(...): the daemon's
# pid must be recorded in this shell.
cluster_start_daemon() {
  local i="$1" log deadline address lines_before
  shift
  log="${CLUSTER_TMP}/cohortd-${i}.log"
  : >> "${log}"
  # A restarted daemon appends to the same log: only lines after this count.
  lines_before="$(wc -l < "${log}")"
  CLUSTER_DAEMON_ARGS[i]="$(printf '%q ' "$@")"
  mkdir -p "${CLUSTER_TMP}/data-${i}"
  chmod 0711 "${CLUSTER_TMP}/data-${i}"
  # The hosts share one kernel: left to itself UCX sees one machine (it compares boot ids) and
  # moves tensors through shared memory. Real hosts talk over the network, so workers get TCP over
  # their namespace's interface (inherited from cohortd's environment; a job's env still wins).
  # exec all the way down (ip netns exec, nsenter and env exec too), so that $! is cohortd itself:
  # a function or a subshell in between would take the signals meant for the daemon.
  (exec ip netns exec "$(cluster_host_ns "${i}")" nsenter --uts="$(_cluster_uts "${i}")" -- \
    env UCX_TLS="${CLUSTER_UCX_TLS}" UCX_NET_DEVICES="${CLUSTER_UCX_NET_DEVICES}" \
    "${COHORTD}" --listen "$(cluster_host_addr "${i}"):${_CLUSTER_LISTEN_PORT:-0}" \
    --data-dir "${CLUSTER_TMP}/data-${i}" "$@" >> "${log}" 2>&1) &
  CLUSTER_DAEMON_PIDS[i]=$!
  deadline=$((SECONDS + CLUSTER_START_TIMEOUT_S))
  while ((SECONDS < deadline)); do
    address="$(tail -n "+$((lines_before + 1))" "${log}" | sed -n 's/^listening on //p' | tail -n 1)"
    if [[ -n "${address}" ]]; then
      CLUSTER_LAST_ADDRESS="${address}"
      CLUSTER_DAEMON_ADDRESSES[i]="${address}"
      return 0
    fi
    kill -0 "${CLUSTER_DAEMON_PIDS[i]}" 2> /dev/null || break
    sleep "${CLUSTER_POLL_S}"
  done
  echo "FAIL: cohortd on host ${i} did not start; its log:" >&2
  tail -n 30 "${log}" >&2
  return 1
}

# Stops host i's cohortd with SIGTERM (it drains: its tasks are stopped) and waits for it.
cluster_stop_daemon() {
  local i="$1"
  kill -TERM "${CLUSTER_DAEMON_PIDS[i]}" 2> /dev/null
  wait "${CLUSTER_DAEMON_PIDS[i]}" 2> /dev/null
}

# Sends signal `sig` (KILL, STOP, CONT...) to host i's cohortd, for fault injection. Cleanup
# handles stopped and killed daemons alike.
cluster_signal_daemon() { kill -"$2" "${CLUSTER_DAEMON_PIDS[$1]}"; }

# Starts host i's cohortd again, with the flags it was first started with and on the same address
# and port (agents and the admin's credentials name the coordinator's), e.g. after
# `cluster_signal_daemon i KILL`. A daemon still running is SIGKILLed first. The data directory is
# kept: the coordinator recovers its jobs, an agent keeps its node certificate.
cluster_restart_daemon() {
  local i="$1" address="${CLUSTER_DAEMON_ADDRESSES[$1]}"
  kill -KILL "${CLUSTER_DAEMON_PIDS[i]}" 2> /dev/null
  kill -CONT "${CLUSTER_DAEMON_PIDS[i]}" 2> /dev/null
  wait "${CLUSTER_DAEMON_PIDS[i]}" 2> /dev/null
  local -a args
  eval "args=(${CLUSTER_DAEMON_ARGS[i]})"
  _CLUSTER_LISTEN_PORT="${address##*:}" cluster_start_daemon "${i}" "${args[@]}"
}

# Whether host i's cohortd process still exists (running or stopped).
cluster_daemon_alive() { kill -0 "${CLUSTER_DAEMON_PIDS[$1]}" 2> /dev/null; }

# Waits until exactly `count` nodes are live; returns 1 after `timeout` seconds.
cluster_wait_nodes() {
  local count="$1" timeout="${2:-${CLUSTER_START_TIMEOUT_S}}" deadline live
  deadline=$((SECONDS + timeout))
  while ((SECONDS < deadline)); do
    live="$(cluster_cli nodes -o json 2> /dev/null | jq '.nodes | length')"
    [[ "${live}" == "${count}" ]] && return 0
    sleep "${CLUSTER_POLL_S}"
  done
  echo "FAIL: ${live:-no} nodes live after ${timeout} s, expected ${count}" >&2
  return 1
}

# The node ids `cohort nodes` lists, one a line.
cluster_node_ids() { cluster_cli nodes -o json | jq -r '.nodes[].node.node_id'; }

# Makes `count` hosts and starts a cluster on them: host 1 runs the coordinator and an agent
# (--role all), the others an agent each joined with its own join token; each node has `slots`
# slots and is named by its host name (cohortd's default node id). Extra cohortd flags for the
# coordinator come from CLUSTER_COORDINATOR_FLAGS, for every daemon from CLUSTER_DAEMON_FLAGS.
cluster_start() {
  local count="$1" slots="$2" i token
  # The *_FLAGS variables are word lists: split on purpose.
  # shellcheck disable=SC2206,SC2086
  local -a common=(--slots "${slots}" --worker "${COHORT_WORKER}" ${CLUSTER_DAEMON_FLAGS:-})
  cluster_create_hosts "${count}" || return 1
  # shellcheck disable=SC2086
  cluster_start_daemon 1 --role all "${common[@]}" ${CLUSTER_COORDINATOR_FLAGS:-} || return 1
  CLUSTER_COORDINATOR="${CLUSTER_LAST_ADDRESS}"
  CLUSTER_CREDENTIALS="${CLUSTER_TMP}/data-1/admin.credentials"
  for ((i = 2; i <= count; i++)); do
    token="$(cluster_cli node token)" || { echo "FAIL: cohort node token failed" >&2; return 1; }
    cluster_start_daemon "${i}" --role agent --coordinator "${CLUSTER_COORDINATOR}" --join-token "${token}" \
      "${common[@]}" || return 1
  done
  cluster_wait_nodes "${count}" || return 1
  cluster_log "cluster up: coordinator ${CLUSTER_COORDINATOR}, nodes $(cluster_node_ids | tr '\n' ' ')"
}

# Submits a job file; prints its id.
cluster_submit() { cluster_cli submit "$1" -o json | jq -r .job_id; }

cluster_job_json() { cluster_cli status "$1" -o json; }
cluster_job_state() { cluster_job_json "$1" | jq -r .state; }

# Waits until job `id` is in one of the states `states` (space-separated, e.g. "SUCCEEDED FAILED")
# and prints that state; returns 1 (printing the last state) after `timeout` seconds.
cluster_wait_job() {
  local id="$1" states="$2" timeout="$3" deadline state
  deadline=$((SECONDS + timeout))
  while ((SECONDS < deadline)); do
    state="$(cluster_job_state "${id}" 2> /dev/null)"
    if [[ " ${states} " == *" ${state} "* ]]; then
      echo "${state}"
      return 0
    fi
    sleep "${CLUSTER_POLL_S}"
  done
  echo "${state:-unknown}"
  return 1
}

# Partitions host i from every other host (its link to the bridge goes down), and heals it.
cluster_partition() { ip -n "$(cluster_hub_ns)" link set "h$1" down; }
cluster_heal() { ip -n "$(cluster_hub_ns)" link set "h$1" up; }
