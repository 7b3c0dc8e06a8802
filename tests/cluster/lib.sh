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
# The host daemon i runs on: i itself, except the coordinators of cluster_start_ha, which are
# daemons 11, 12, ... on hosts 1, 2, ... (each host also runs its agent, daemon i).
declare -a CLUSTER_DAEMON_HOST=()
# High availability (cluster_start_ha): the coordinators' HOST:PORT list that agents and the CLI
# are given, their daemon indices, the etcd cluster's etcd://... URL, its members' pids (by host)
# and the PEM files a client of it needs.
CLUSTER_COORDINATORS=""
declare -a CLUSTER_HA_DAEMONS=()
CLUSTER_ETCD_URL=""
# shellcheck disable=SC2034  # for tests
declare -a CLUSTER_ETCD_PIDS=()
CLUSTER_ETCD_PKI=""
# Every HA coordinator listens on this port of its host's address (each host has its own network).
readonly CLUSTER_HA_PORT=7070
readonly CLUSTER_ETCD_CLIENT_PORT=2379
readonly CLUSTER_ETCD_PEER_PORT=2380

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
  for log in "${CLUSTER_TMP}"/cohortd-*.log "${CLUSTER_TMP}"/etcd-*.log; do
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
  for tool in ip unshare nsenter jq ${CLUSTER_NEEDS_TOOLS:-}; do
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

# The cohort CLI as the cluster's admin, from the hub namespace; given every coordinator's address
# under high availability (the credentials file names the first one only).
cluster_cli() {
  local -a where=()
  [[ -z "${CLUSTER_COORDINATORS}" ]] || where=(--coordinator "${CLUSTER_COORDINATORS}")
  ip netns exec "$(cluster_hub_ns)" "${COHORT_CLI}" --credentials "${CLUSTER_CREDENTIALS}" "${where[@]}" "$@"
}

_cluster_daemon_host() { echo "${CLUSTER_DAEMON_HOST[$1]:-$1}"; }

# Starts cohortd on host i with the given flags (--data-dir and --listen are set here); waits for
# "listening on HOST:PORT" and sets CLUSTER_LAST_ADDRESS to HOST:PORT. Not in $(...): the daemon's
# pid must be recorded in this shell.
cluster_start_daemon() {
  local i="$1" log deadline address lines_before host
  shift
  host="$(_cluster_daemon_host "${i}")"
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
  (exec ip netns exec "$(cluster_host_ns "${host}")" nsenter --uts="$(_cluster_uts "${host}")" -- \
    env UCX_TLS="${CLUSTER_UCX_TLS}" UCX_NET_DEVICES="${CLUSTER_UCX_NET_DEVICES}" \
    "${COHORTD}" --listen "$(cluster_host_addr "${host}"):${_CLUSTER_LISTEN_PORT:-0}" \
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
  echo "FAIL: cohortd ${i} on host ${host} did not start; its log:" >&2
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

# --- High availability (issue 16): a 3-member etcd cluster, one member per host on the host's own
# address, TLS with client certificates (as tests/etcd makes them), and coordinators on several
# hosts electing their leader in it and keeping the jobs there.

# A CA, one certificate for every member (server and peer; SANs: every host's address) and one
# client certificate (for the coordinators, and the test's health probes), in CLUSTER_ETCD_PKI.
_cluster_etcd_certificates() {
  local count="$1" dir i san="IP:127.0.0.1"
  local -a ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  dir="${CLUSTER_TMP}/etcd-pki"
  mkdir -m 0700 "${dir}" || return 1
  for ((i = 1; i <= count; i++)); do san+=",IP:$(cluster_host_addr "${i}")"; done
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' \
    "${san}" > "${dir}/member.ext"
  printf 'extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' > "${dir}/client.ext"
  if ! {
    openssl req -x509 "${ec[@]}" -days 2 -subj /CN=cohort-cluster-test-etcd-ca -keyout "${dir}/ca-key.pem" \
      -out "${dir}/ca.pem" &&
      openssl req -new "${ec[@]}" -subj /CN=etcd-member -keyout "${dir}/member-key.pem" -out "${dir}/member.csr" &&
      openssl x509 -req -in "${dir}/member.csr" -CA "${dir}/ca.pem" -CAkey "${dir}/ca-key.pem" -CAcreateserial \
        -days 2 -extfile "${dir}/member.ext" -out "${dir}/member.pem" &&
      openssl req -new "${ec[@]}" -subj /CN=cohort-coordinator -keyout "${dir}/client-key.pem" -out "${dir}/client.csr" &&
      openssl x509 -req -in "${dir}/client.csr" -CA "${dir}/ca.pem" -CAkey "${dir}/ca-key.pem" -CAcreateserial \
        -days 2 -extfile "${dir}/client.ext" -out "${dir}/client.pem"
  } > "${dir}/openssl.log" 2>&1; then
    echo "FAIL: making the etcd certificates failed:" >&2
    cat "${dir}/openssl.log" >&2
    return 1
  fi
  chmod 0600 "${dir}"/*-key.pem
  CLUSTER_ETCD_PKI="${dir}"
}

# An HTTPS GET of etcd member i's client URL from the hub namespace, with the client certificate.
cluster_etcd_get() {
  ip netns exec "$(cluster_hub_ns)" curl -s --max-time 2 --cacert "${CLUSTER_ETCD_PKI}/ca.pem" \
    --cert "${CLUSTER_ETCD_PKI}/client.pem" --key "${CLUSTER_ETCD_PKI}/client-key.pem" \
    "https://$(cluster_host_addr "$1"):${CLUSTER_ETCD_CLIENT_PORT}$2"
}

# Starts etcd member i on host i (a new cluster's member, or a killed one's restart: its data
# directory decides). Not in $(...): the pid is recorded in this shell.
_cluster_etcd_launch() {
  local i="$1" count="$2" j initial="" addr state=new
  addr="$(cluster_host_addr "${i}")"
  for ((j = 1; j <= count; j++)); do
    initial+="${initial:+,}etcd-${j}=https://$(cluster_host_addr "${j}"):${CLUSTER_ETCD_PEER_PORT}"
  done
  [[ -d "${CLUSTER_TMP}/etcd-${i}/member" ]] && state=existing
  mkdir -p "${CLUSTER_TMP}/etcd-${i}"
  chmod 0700 "${CLUSTER_TMP}/etcd-${i}"
  # Heartbeat and election timeout: etcd's defaults are 100/1000 ms; kept (a busy 2-core machine
  # runs the members, and a member's election timeout must not fire because it waited for a core).
  # --pre-vote (etcd 3.5's default, off in 3.4): a member that was cut off campaigns with ever higher
  # terms; without pre-vote its return deposes the healthy leader, and the whole cluster has no
  # leader for seconds (seen: 3.5 s, longer than a coordinator's lease) after every partition.
  (exec ip netns exec "$(cluster_host_ns "${i}")" nsenter --uts="$(_cluster_uts "${i}")" -- \
    /usr/bin/etcd --name "etcd-${i}" --data-dir "${CLUSTER_TMP}/etcd-${i}" \
    --listen-client-urls "https://${addr}:${CLUSTER_ETCD_CLIENT_PORT}" \
    --advertise-client-urls "https://${addr}:${CLUSTER_ETCD_CLIENT_PORT}" \
    --listen-peer-urls "https://${addr}:${CLUSTER_ETCD_PEER_PORT}" \
    --initial-advertise-peer-urls "https://${addr}:${CLUSTER_ETCD_PEER_PORT}" \
    --initial-cluster "${initial}" --initial-cluster-state "${state}" \
    --initial-cluster-token "cohort-cluster-${CLUSTER_ID}" \
    --cert-file "${CLUSTER_ETCD_PKI}/member.pem" --key-file "${CLUSTER_ETCD_PKI}/member-key.pem" \
    --trusted-ca-file "${CLUSTER_ETCD_PKI}/ca.pem" --client-cert-auth \
    --peer-cert-file "${CLUSTER_ETCD_PKI}/member.pem" --peer-key-file "${CLUSTER_ETCD_PKI}/member-key.pem" \
    --peer-trusted-ca-file "${CLUSTER_ETCD_PKI}/ca.pem" --peer-client-cert-auth \
    --pre-vote --logger zap --log-outputs stderr --log-level warn >> "${CLUSTER_TMP}/etcd-${i}.log" 2>&1) &
  # shellcheck disable=SC2034  # for tests
  CLUSTER_ETCD_PIDS[i]=$!
}

# Makes the certificates and starts one etcd member on each of hosts 1..count; waits until every
# member reports itself healthy over TLS with the client certificate. Sets CLUSTER_ETCD_URL.
cluster_start_etcd() {
  local count="$1" i deadline healthy
  command -v /usr/bin/etcd > /dev/null || { echo "FAIL: /usr/bin/etcd is not installed (apt-get install etcd-server)" >&2; return 1; }
  _cluster_etcd_certificates "${count}" || return 1
  local endpoints=""
  for ((i = 1; i <= count; i++)); do
    _cluster_etcd_launch "${i}" "${count}"
    endpoints+="${endpoints:+,}$(cluster_host_addr "${i}"):${CLUSTER_ETCD_CLIENT_PORT}"
  done
  CLUSTER_ETCD_URL="etcd://${endpoints}"
  deadline=$((SECONDS + CLUSTER_START_TIMEOUT_S))
  while ((SECONDS < deadline)); do
    healthy=0
    for ((i = 1; i <= count; i++)); do
      [[ "$(cluster_etcd_get "${i}" /health 2> /dev/null | jq -r .health 2> /dev/null)" == true ]] && healthy=$((healthy + 1))
    done
    if ((healthy == count)); then
      cluster_log "etcd up: ${CLUSTER_ETCD_URL} (TLS, client certificates)"
      return 0
    fi
    sleep "${CLUSTER_POLL_S}"
  done
  echo "FAIL: the etcd cluster was not healthy within ${CLUSTER_START_TIMEOUT_S} s (${healthy} of ${count} members)" >&2
  for ((i = 1; i <= count; i++)); do tail -n 20 "${CLUSTER_TMP}/etcd-${i}.log" >&2; done
  return 1
}

# The gRPC health of cohort.v1.Coordinator at HA coordinator daemon i (11, 12, ...), asked over
# TLS (the cluster CA) with curl's HTTP/2 from the hub namespace: SERVING on the leader only,
# NOT_SERVING on a standby, DOWN when no answer came within `timeout` seconds (default 1; stopped,
# killed or cut off). Health is public: no credentials are sent.
cluster_coordinator_health() {
  local i="$1" timeout="${2:-1}" body
  body="$(ip netns exec "$(cluster_hub_ns)" curl -s --http2 --max-time "${timeout}" \
    --cacert "${CLUSTER_TMP}/data-11/ca/ca.crt" -H 'content-type: application/grpc' -H 'te: trailers' \
    --data-binary "@${CLUSTER_TMP}/health-request.bin" \
    "https://${CLUSTER_DAEMON_ADDRESSES[i]:-not-started.invalid:1}/grpc.health.v1.Health/Check" 2> /dev/null | od -An -tx1 | tr -d ' \n')"
  # One gRPC message: flag 0, length 2, field 1 (status) = 1 SERVING or 2 NOT_SERVING.
  case "${body}" in
    00000000020801) echo SERVING ;;
    00000000020802) echo NOT_SERVING ;;
    *) echo DOWN ;;
  esac
}

# The daemon indices of the HA coordinators that report SERVING (normally one: the leader), one a
# line.
cluster_leaders() {
  local i
  for i in "${CLUSTER_HA_DAEMONS[@]}"; do
    [[ "$(cluster_coordinator_health "${i}" "${1:-1}")" == SERVING ]] && echo "${i}"
  done
}

# Waits until exactly one coordinator leads and prints its daemon index; returns 1 after `timeout`
# seconds.
cluster_wait_leader() {
  local timeout="${1:-${CLUSTER_START_TIMEOUT_S}}" deadline
  local -a leaders=()
  deadline=$((SECONDS + timeout))
  while ((SECONDS < deadline)); do
    mapfile -t leaders < <(cluster_leaders 1)
    if ((${#leaders[@]} == 1)); then
      echo "${leaders[0]}"
      return 0
    fi
    sleep "${CLUSTER_POLL_S}"
  done
  echo "FAIL: no single coordinator leads after ${timeout} s (leading: ${leaders[*]:-none})" >&2
  return 1
}

# Makes `count` hosts and a highly available cluster on them (README "High availability"): an etcd
# member on every host; `coordinators` coordinators (daemons 11, 12, ... on hosts 1, 2, ...,
# port CLUSTER_HA_PORT) electing their leader in etcd and keeping jobs there
# (leader_lease_ms CLUSTER_LEADER_LEASE_MS, default 3000); an agent on every host (daemon i, role
# agent, `slots` slots) given every coordinator's address. The first coordinator starts alone, makes
# the cluster CA and the admin, the agents join it, then its ca/ is copied to the other coordinators'
# data directories and they start (README: identities follow the leader through etcd; only ca/ is
# copied by hand). Flags: CLUSTER_COORDINATOR_FLAGS
# for the coordinators, CLUSTER_DAEMON_FLAGS for the agents.
cluster_start_ha() {
  local count="$1" slots="$2" coordinators="$3" h i token leader
  if ((coordinators < 2 || coordinators > count)); then
    echo "FAIL: cluster_start_ha: ${coordinators} coordinators on ${count} hosts (2..${count})" >&2
    return 1
  fi
  # shellcheck disable=SC2206,SC2086  # word lists, split on purpose
  local -a common=(--slots "${slots}" --worker "${COHORT_WORKER}" ${CLUSTER_DAEMON_FLAGS:-})
  cluster_create_hosts "${count}" || return 1
  cluster_start_etcd "${count}" || return 1
  local list=""
  CLUSTER_HA_DAEMONS=()
  for ((h = 1; h <= coordinators; h++)); do
    CLUSTER_DAEMON_HOST[10 + h]="${h}"
    CLUSTER_HA_DAEMONS+=($((10 + h)))
    list+="${list:+,}$(cluster_host_addr "${h}"):${CLUSTER_HA_PORT}"
  done
  printf '\x00\x00\x00\x00\x17\x0a\x15cohort.v1.Coordinator' > "${CLUSTER_TMP}/health-request.bin"
  # shellcheck disable=SC2206,SC2086
  local -a ha=(--role coordinator --election "${CLUSTER_ETCD_URL}" --job-store "${CLUSTER_ETCD_URL}"
    --etcd-ca "${CLUSTER_ETCD_PKI}/ca.pem" --etcd-cert "${CLUSTER_ETCD_PKI}/client.pem"
    --etcd-key "${CLUSTER_ETCD_PKI}/client-key.pem" --leader-lease-ms "${CLUSTER_LEADER_LEASE_MS:-3000}"
    ${CLUSTER_COORDINATOR_FLAGS:-})
  # 1. The first coordinator alone: it makes the cluster CA and the admin, and leads.
  _CLUSTER_LISTEN_PORT="${CLUSTER_HA_PORT}" cluster_start_daemon 11 "${ha[@]}" || return 1
  CLUSTER_CREDENTIALS="${CLUSTER_TMP}/data-11/admin.credentials"
  CLUSTER_COORDINATOR="${CLUSTER_LAST_ADDRESS}"
  cluster_wait_leader "${CLUSTER_START_TIMEOUT_S}" > /dev/null || return 1
  # 2. Every host's agent joins it, given every coordinator's address.
  CLUSTER_COORDINATORS="${CLUSTER_COORDINATOR}"
  for ((i = 1; i <= count; i++)); do
    token="$(cluster_cli node token)" || { echo "FAIL: cohort node token failed" >&2; return 1; }
    cluster_start_daemon "${i}" --role agent --coordinator "${list}" --join-token "${token}" "${common[@]}" || return 1
  done
  cluster_wait_nodes "${count}" || return 1
  # 3. Seed the standbys with its CA only, while it leads: the users, join tokens and node
  # certificates they need once they lead come from etcd.
  for ((h = 2; h <= coordinators; h++)); do
    mkdir -p "${CLUSTER_TMP}/data-$((10 + h))"
    cp -a "${CLUSTER_TMP}/data-11/ca" "${CLUSTER_TMP}/data-$((10 + h))/ca" || return 1
  done
  for ((h = 2; h <= coordinators; h++)); do
    _CLUSTER_LISTEN_PORT="${CLUSTER_HA_PORT}" cluster_start_daemon $((10 + h)) "${ha[@]}" || return 1
  done
  CLUSTER_COORDINATORS="${list}"
  leader="$(cluster_wait_leader "${CLUSTER_START_TIMEOUT_S}")" || return 1
  cluster_wait_nodes "${count}" || return 1
  cluster_log "HA cluster up: coordinators ${list} (leader: daemon ${leader}), etcd ${CLUSTER_ETCD_URL}, nodes $(cluster_node_ids | tr '\n' ' ')"
}
