#!/bin/bash
# A bounded chaos test (issue 16) on three simulated hosts (tests/cluster/lib.sh, 2 slots per host).
#
# Two setups:
#   --ha (the default): the highly available coordinator (README "High availability"). A 3-member
#     etcd cluster, one member per host on the host's own address, TLS with client certificates
#     made by the test; coordinators on host-1 and host-2 (--coordinators 3: host-3 too) electing
#     their leader in etcd (leader_lease_ms 3000) and keeping the jobs there; an agent on every host
#     and the admin's CLI, all given the coordinators' list.
#   --single: host-1 runs the single SQLite coordinator and an agent (--role all), host-2 and
#     host-3 an agent each.
# For DURATION seconds
# a stream of small jobs runs (command jobs of 1-3 nodes that beat their heartbeat, some that fail on
# purpose or hang, a few real cohort-worker graph jobs; max_restarts 0-2; some cancelled) while a
# seeded fault injector picks, one fault at a time, among:
#   worker_kill        SIGKILL a rank
#   worker_stop        SIGSTOP a rank and leave it (the agent must kill it: stopped_task_limit)
#   worker_stop_brief  SIGSTOP a rank, SIGCONT it before the limit (it must be forgiven)
#   agent_kill         SIGKILL an agent's cohortd, restart it 0.5-3 s later (--single: host-2's or
#                      host-3's; host-1's is the coordinator)
#   agent_stop         SIGSTOP an agent's cohortd for 1 s to the node lease + 2 s
#   partition          take a host's link down for 1 s to the node lease + 3 s, then heal it (--ha:
#                      its etcd member and coordinator are cut off too; the leader's host included)
# --ha only (the leader is found by asking every coordinator's gRPC health: SERVING on the leader,
# NOT_SERVING on a standby):
#   leader_kill        SIGKILL the leading coordinator's cohortd, restart it 0.5-3 s later (as a
#                      standby); another must lead within the etcd lease
#   leader_stop        SIGSTOP the leading coordinator for 1-8 s, then SIGCONT: if a standby took
#                      over meanwhile, the old leader must step down (cohortd exits 1, and the test
#                      restarts it as systemd's Restart=on-failure would), never lead beside it
# --single only:
#   coordinator_kill   SIGKILL host-1's cohortd (coordinator + agent), restart it on its port 0.5-2 s
#                      later; it recovers its jobs from SQLite and reconciles with the agents
# A coordinator that exits on its own is restarted at once (--ha: exit 1 after "lost its
# leadership" is the designed step-down; any other exit fails the test).
# Then faults stop, everything is healed and resumed, and the test asserts:
#   - every submitted job ends SUCCEEDED, FAILED or CANCELLED within a deadline (the stuck ones are
#     named), FAILED and CANCELLED ones with a reason, and the coordinator knows every id (lost 0);
#     every job it lists (a submit whose answer was lost included) is final too;
#   - after the end no process of the run is left (no rank, no child of one, in the hosts'
#     namespaces or anywhere: /proc is scanned for the run's marker variable), and after cleanup no
#     namespace or cohortd of the run;
#   - no slot leaked: every node's free slots equal its slots;
#   - a faulted rank is noticed within WORKER_DETECT_BOUND_S;
#   - --ha: after every leader_kill and leader_stop longer than the lease, a coordinator leads again
#     within FAILOVER_BOUND_S; two coordinators never both report SERVING for longer than
#     SPLIT_BRAIN_BOUND_MS (the probes are not atomic: a resumed leader may answer one probe before
#     its election thread notices the lost lease); a stopped leader that was replaced steps down
#     within STEPDOWN_BOUND_S of its SIGCONT; the slot check asks the leader.
# and prints its figures: jobs by final state and kind, faults by kind, restarts, detection latency
# (fault -> the coordinator's state change of the job's attempt, from its log; median and max),
# failover time (leader fault -> "leads the cluster now" in a coordinator's log), lost.
#
#   tests/cluster/chaos_test.sh                       # --ha, 60 s of faults (~2 min in all)
#   tests/cluster/chaos_test.sh --duration 600 --seed 4242
#   tests/cluster/chaos_test.sh --single --seed 7     # the single SQLite coordinator
#   COHORT_CHAOS_DURATION_S=600 COHORT_CHAOS_SEED=4242 bazel test //tests/cluster:chaos_test
# Outside Bazel the binaries come from bazel-bin (build //daemon:cohortd //client:cohort
# //worker/runner:cohort-worker first) or $COHORTD, $COHORT_CLI, $COHORT_WORKER; run as root.
set -u

usage() {
  cat << 'EOF'
usage: chaos_test.sh [--duration SECONDS] [--seed N] [--ha [--coordinators 2|3] | --single]

  --duration SECONDS  how long faults are injected and jobs submitted (default 60; env
                      COHORT_CHAOS_DURATION_S); draining and checks take up to ~2 min more
  --seed N            the fault injector's and job stream's seed (default: from the clock; env
                      COHORT_CHAOS_SEED). The same seed replays the same sequence of choices; what
                      each fault hits still depends on timing.
  --ha                highly available coordinators over a 3-member etcd cluster (the default;
                      env COHORT_CHAOS_HA=1); --coordinators N: 2 (default) or 3 of them
  --single            one SQLite coordinator on host-1 (env COHORT_CHAOS_HA=0)
Needs root (network namespaces); prints SKIP without it.
EOF
}

DURATION_S="${COHORT_CHAOS_DURATION_S:-60}"
HA="${COHORT_CHAOS_HA:-1}"
COORDINATORS="${COHORT_CHAOS_COORDINATORS:-2}"
SEED="${COHORT_CHAOS_SEED:-$(($(date +%s%N) / 1000 % 1000000))}"
while (($# > 0)); do
  case "$1" in
    --duration) DURATION_S="${2:-}"; shift 2 || { usage; exit 2; } ;;
    --duration=*) DURATION_S="${1#*=}"; shift ;;
    --seed) SEED="${2:-}"; shift 2 || { usage; exit 2; } ;;
    --seed=*) SEED="${1#*=}"; shift ;;
    --ha) HA=1; shift ;;
    --single) HA=0; shift ;;
    --coordinators) COORDINATORS="${2:-}"; shift 2 || { usage; exit 2; } ;;
    --coordinators=*) COORDINATORS="${1#*=}"; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "chaos_test: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
if ! [[ "${DURATION_S}" =~ ^[0-9]+$ ]] || ((DURATION_S < 5 || DURATION_S > 86400)); then
  echo "chaos_test: --duration '${DURATION_S}' must be whole seconds in 5..86400" >&2
  exit 2
fi
[[ "${SEED}" =~ ^[0-9]+$ ]] || { echo "chaos_test: --seed '${SEED}' must be a whole number" >&2; exit 2; }
[[ "${HA}" == 0 || "${HA}" == 1 ]] || { echo "chaos_test: COHORT_CHAOS_HA '${HA}' must be 0 or 1" >&2; exit 2; }
[[ "${COORDINATORS}" == 2 || "${COORDINATORS}" == 3 ]] ||
  { echo "chaos_test: --coordinators '${COORDINATORS}' must be 2 or 3" >&2; exit 2; }

source "$(dirname "$0")/lib.sh"
# shellcheck disable=SC2034  # read by cluster_init: the HA setup's etcd certificates and probes
((HA)) && CLUSTER_NEEDS_TOOLS="curl openssl od"
cluster_init || exit 0

failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}

readonly HOSTS=3
readonly SLOTS=2
# Jobs not yet final at once (each 1-3 ranks): bounds the processes on the 2-core machine.
readonly MAX_ACTIVE=4
# The node lease. With HA it must outlast a failover (the etcd lease, 3 s, plus the new leader's
# start and the agents' next heartbeat), or every leader fault would fence every running task.
if ((HA)); then readonly LEASE_MS=6000; else readonly LEASE_MS=4000; fi
readonly LEADER_LEASE_MS=3000
# HA: a coordinator leads again this long after the leader was killed or replaced (the etcd lease,
# the election and the store's load, with slack for a loaded machine).
readonly FAILOVER_BOUND_S=15
readonly SPLIT_BRAIN_BOUND_MS=2000
readonly STEPDOWN_BOUND_S=5
# Hang detection, short for the test (daemon config keys, see configs/cohortd.yaml).
readonly STOPPED_LIMIT_MS=1500
readonly HEARTBEAT_TIMEOUT_MS=3000
readonly HEARTBEAT_INTERVAL_MS=500
# A faulted rank must be noticed within this (the stop limit plus ample scheduling slack); later is
# a hang.
readonly WORKER_DETECT_BOUND_S=15
# After the faults stop: every job must be final within this (a job's attempts are a few seconds
# each, at most 3 of them, queued behind MAX_ACTIVE - 1 others).
readonly DRAIN_TIMEOUT_S=120
readonly CLI_TIMEOUT_S=15
readonly LOOP_SLEEP_S=0.3
RUN_MARK="chaos-${CLUSTER_ID}"

RANDOM="${SEED}"
MODE="$( ((HA)) && echo "ha, ${COORDINATORS} coordinators" || echo single)"
REPLAY="tests/cluster/chaos_test.sh --seed ${SEED} --duration ${DURATION_S} $( ((HA)) && echo "--ha --coordinators ${COORDINATORS}" || echo --single)"
echo "chaos: seed ${SEED}, duration ${DURATION_S} s, ${MODE} (replay: ${REPLAY})"

# shellcheck disable=SC2034  # read by cluster_start / cluster_start_ha
CLUSTER_DAEMON_FLAGS="--peer-rpc-timeout-ms 1000 --stop-grace-ms 1000 --stopped-task-limit-ms ${STOPPED_LIMIT_MS}
  --task-heartbeat-timeout-ms ${HEARTBEAT_TIMEOUT_MS} --task-heartbeat-interval-ms ${HEARTBEAT_INTERVAL_MS}"
if ((HA)); then
  # shellcheck disable=SC2034  # read by cluster_start_ha
  CLUSTER_COORDINATOR_FLAGS="--node-lease-ms ${LEASE_MS} --tick-interval-ms 100 --peer-rpc-timeout-ms 1000"
  # shellcheck disable=SC2034  # read by cluster_start_ha
  CLUSTER_LEADER_LEASE_MS="${LEADER_LEASE_MS}"
  cluster_start_ha "${HOSTS}" "${SLOTS}" "${COORDINATORS}" || { cluster_dump_logs; exit 1; }
  # The agents: daemons 1..HOSTS; the coordinators: CLUSTER_HA_DAEMONS (11, 12, ...).
  FIRST_AGENT=1
else
  # shellcheck disable=SC2034  # read by cluster_start
  CLUSTER_COORDINATOR_FLAGS="--node-lease-ms ${LEASE_MS} --tick-interval-ms 100"
  cluster_start "${HOSTS}" "${SLOTS}" || { cluster_dump_logs; exit 1; }
  FIRST_AGENT=2 # host-1's cohortd is the coordinator (and an agent)
fi

# The admin's CLI from the hub namespace, bounded: a partitioned coordinator must not hang the
# test. With HA it is given every coordinator (cluster_cli does that too).
declare -a CCLI_WHERE=()
((HA)) && CCLI_WHERE=(--coordinator "${CLUSTER_COORDINATORS}")
CCLI_TIMEOUT_S="${CLI_TIMEOUT_S}"
ccli() {
  timeout "${CCLI_TIMEOUT_S}" ip netns exec "$(cluster_hub_ns)" "${COHORT_CLI}" --credentials "${CLUSTER_CREDENTIALS}" \
    "${CCLI_WHERE[@]}" "$@"
}

NOW_MS=0
tick_now() {
  local t="${EPOCHREALTIME/[.,]/}"
  NOW_MS=$((t / 1000))
}
# R = a random whole number in [$1, $2]. Call it in the main shell, never in $(...): a subshell
# would not advance the seeded sequence, so the run could not be replayed.
R=0
rand() { R=$(($1 + RANDOM % ($2 - $1 + 1))); }

# --- jobs
declare -A JOB_KIND=()  # id -> ok | fail | hang | graph
declare -a JOB_IDS=()
SUBMIT_FAILURES=0
CANCELS=0

# Writes a job spec of `kind` to file $1. Every rank carries CHAOS_RUN (the orphan scan's marker).
write_spec() {
  local file="$1" kind="$2" nodes="$3" restarts="$4" beats="$5" script
  case "${kind}" in
    ok) # beats every 0.5 s for `beats` beats, then succeeds
      script="i=0; while [ \$i -lt ${beats} ]; do touch \"\$COHORT_HEARTBEAT_FILE\"; sleep 0.5; i=\$((i+1)); done" ;;
    fail) # fails on purpose
      script="touch \"\$COHORT_HEARTBEAT_FILE\"; sleep 1; echo \"chaos: failing on purpose\" >&2; exit 3" ;;
    hang) # beats twice, then hangs without beating: the heartbeat timeout must kill it
      script="touch \"\$COHORT_HEARTBEAT_FILE\"; sleep 0.5; touch \"\$COHORT_HEARTBEAT_FILE\"; sleep 60" ;;
  esac
  if [[ "${kind}" == graph ]]; then
    cat > "${file}" << SPEC
name: chaos-graph
nodes: ${nodes}
procs_per_node: 1
communicator: flat
env: {CHAOS_RUN: "${RUN_MARK}"}
dataset: {kind: synthetic, train_size: 64, test_size: 32, input_shape: [1, 8, 8], num_classes: 4}
data_parallel:
  graph:
    layers:
      - {type: flatten}
      - {type: linear, in_features: 64, out_features: 4}
loss: cross_entropy
optimizer: {kind: sgd, lr: 0.1}
batch_size: 16
epochs: 1
seed: 3
restart_policy: {max_restarts: ${restarts}}
SPEC
  else
    cat > "${file}" << SPEC
name: chaos-${kind}
nodes: ${nodes}
procs_per_node: 1
command: [/bin/sh, -c, '${script}']
env: {CHAOS_RUN: "${RUN_MARK}"}
restart_policy: {max_restarts: ${restarts}}
SPEC
  fi
}

LAST_LIST='{"jobs":[]}'
# Refreshes LAST_LIST (every user's jobs); keeps the old one when the coordinator is unreachable.
refresh_list() {
  local list
  list="$(ccli list --all -o json 2> /dev/null)" && [[ -n "${list}" ]] && LAST_LIST="${list}"
}
# Ids of the run's jobs not yet final, per LAST_LIST (a job missing from it counts as active).
active_jobs() {
  local id
  local -A final=()
  while read -r id; do final["${id}"]=1; done < <(jq -r '.jobs[] | select(.state == "SUCCEEDED" or .state == "FAILED" or .state == "CANCELLED") | .id' <<< "${LAST_LIST}")
  for id in "${JOB_IDS[@]}"; do [[ -n "${final[${id}]:-}" ]] || echo "${id}"; done
}
# Running jobs with a rank on host $1 (all hosts with "all").
jobs_on_host() {
  local node=""
  [[ "$1" == all ]] || node="$(cluster_host_name "$1")"
  jq -r --arg node "${node}" \
    '.jobs[] | select(.state == "RUNNING") | select($node == "" or any(.placement.nodes[]; .node_id == $node)) | .id' <<< "${LAST_LIST}" |
    tr '\n' ' '
}

GRAPH_ACTIVE_ID=""
submit_one() {
  local kind nodes restarts beats roll id file
  roll=$((RANDOM % 100))
  if ((roll < 70)); then kind=ok; elif ((roll < 80)); then kind=fail; elif ((roll < 88)); then kind=hang; else kind=graph; fi
  # One graph job at a time: each rank loads libtorch.
  if [[ "${kind}" == graph && -n "${GRAPH_ACTIVE_ID}" ]]; then kind=ok; fi
  roll=$((RANDOM % 100))
  if ((roll < 40)); then nodes=1; elif ((roll < 75)); then nodes=2; else nodes=3; fi
  [[ "${kind}" == graph ]] && nodes=2
  restarts=$((RANDOM % 3))
  rand 4 12
  beats="${R}"
  file="${CLUSTER_TMP}/spec-${#JOB_IDS[@]}.yaml"
  write_spec "${file}" "${kind}" "${nodes}" "${restarts}" "${beats}"
  id="$(ccli submit "${file}" -o json 2> /dev/null | jq -r '.job_id // empty' 2> /dev/null)"
  if [[ -z "${id}" ]]; then
    SUBMIT_FAILURES=$((SUBMIT_FAILURES + 1)) # coordinator down or cut off: tried again later
    return
  fi
  JOB_IDS+=("${id}")
  JOB_KIND["${id}"]="${kind}"
  [[ "${kind}" == graph ]] && GRAPH_ACTIVE_ID="${id}"
}

# --- faults
declare -A FAULT_COUNT=()
declare -a FAULT_KIND=() FAULT_T0=() FAULT_JOBS=() FAULT_WHAT=()
# HA: the leader a fault hit (daemon index; leader faults and partitions of the leader's host),
# and when a stopped leader got its SIGCONT (ms).
declare -a FAULT_LEADER=() FAULT_CONT_MS=()
AGENT_RESTARTS=0
COORDINATOR_RESTARTS=0
STEPDOWN_RESTARTS=0 # HA: coordinators that exited after losing their leadership, restarted
PENDING_DUE=0     # when the current fault's end action is due (ms); 0: none
PENDING_ACTION="" # e.g. "cont_pid 123", "restart 2", "cont_daemon 3", "heal 1", "cont_leader 11"

record_fault() { # kind jobs what [leader]
  FAULT_KIND+=("$1")
  FAULT_T0+=("${NOW_MS}")
  FAULT_JOBS+=("$2")
  FAULT_WHAT+=("$3")
  FAULT_LEADER+=("${4:-}")
  FAULT_CONT_MS+=("")
  FAULT_COUNT["$1"]=$((${FAULT_COUNT["$1"]:-0} + 1))
  cluster_log "fault $1: $3${2:+ (jobs: $2)}"
}

# --- HA: the leader, split brain, coordinators that exit
# The daemon indices reporting SERVING (LEADERS), from every coordinator's health.
declare -a LEADERS=()
probe_leaders() { mapfile -t LEADERS < <(cluster_leaders 0.5); }
DUAL_SINCE_MS=0  # when two coordinators first reported SERVING together (0: not now)
DUAL_MAX_MS=0    # the longest such stretch seen
DUAL_ROUNDS=0    # probe rounds that saw more than one SERVING
SPLIT_BRAIN_FAILED=0
# Restarts an HA coordinator that exited on its own, as systemd's Restart=on-failure would: exit 1
# after "lost its leadership" is the designed step-down; anything else is a failure. Then checks
# that at most one coordinator serves as the leader (for SPLIT_BRAIN_BOUND_MS at most).
watch_coordinators() {
  ((HA)) || return 0
  local i rc log since why
  for i in "${CLUSTER_HA_DAEMONS[@]}"; do
    [[ "${PENDING_ACTION}" == "restart ${i}" ]] && continue # killed by the test; restarted when due
    cluster_daemon_alive "${i}" && continue
    wait "${CLUSTER_DAEMON_PIDS[i]}" 2> /dev/null
    rc=$?
    # What this run of it logged (the log is appended across restarts).
    log="${CLUSTER_TMP}/cohortd-${i}.log"
    since="$(awk '/^listening on /{ n = NR } END { print n + 0 }' "${log}")"
    why="$(tail -n "+$((since + 1))" "${log}" | grep -E 'lost its leadership|was elected but cannot lead' | head -n 1)"
    if ((rc == 1)) && [[ -n "${why}" ]]; then
      STEPDOWN_RESTARTS=$((STEPDOWN_RESTARTS + 1))
      cluster_log "coordinator ${i} stepped down and exited 1; restarting it (${why##*] })"
    else
      why="$(tail -n "+$((since + 1))" "${log}" | grep -E '\[(error|critical)\]|^cohortd: ' | tail -n 1)"
      fail "coordinator ${i} (host-$(_cluster_daemon_host "${i}")) exited with status ${rc} on its own: ${why:-$(tail -n 1 "${log}")}"
    fi
    cluster_restart_daemon "${i}" || fail "coordinator ${i} does not start again after it exited"
  done
  probe_leaders
  tick_now
  if ((${#LEADERS[@]} > 1)); then
    DUAL_ROUNDS=$((DUAL_ROUNDS + 1))
    ((DUAL_SINCE_MS == 0)) && DUAL_SINCE_MS="${NOW_MS}"
    ((NOW_MS - DUAL_SINCE_MS > DUAL_MAX_MS)) && DUAL_MAX_MS=$((NOW_MS - DUAL_SINCE_MS))
    cluster_log "coordinators ${LEADERS[*]} all report SERVING (for ${DUAL_MAX_MS} ms so far)"
    if ((NOW_MS - DUAL_SINCE_MS > SPLIT_BRAIN_BOUND_MS && !SPLIT_BRAIN_FAILED)); then
      SPLIT_BRAIN_FAILED=1
      fail "split brain: coordinators ${LEADERS[*]} all lead for more than ${SPLIT_BRAIN_BOUND_MS} ms"
    fi
  else
    DUAL_SINCE_MS=0
  fi
}
# The daemon index of the one coordinator that leads now; returns 1 when none or several do.
current_leader() {
  probe_leaders
  ((${#LEADERS[@]} == 1)) || return 1
  echo "${LEADERS[0]}"
}
# Whether a standby is ready to take over from leader $1: another coordinator runs and answers
# NOT_SERVING. A leader fault waits for one; otherwise it would measure a restart, not a failover.
standby_ready() {
  local i
  for i in "${CLUSTER_HA_DAEMONS[@]}"; do
    [[ "${i}" == "$1" ]] && continue
    cluster_daemon_alive "${i}" && [[ "$(cluster_coordinator_health "${i}" 0.5)" == NOT_SERVING ]] && return 0
  done
  return 1
}

# Prints "pid job host" of every running rank (a process group leader carrying the run's marker in
# a host's namespace), one a line.
running_ranks() {
  local host pid stat env job
  local -a fields
  for ((host = 1; host <= HOSTS; host++)); do
    for pid in $(ip netns pids "$(cluster_host_ns "${host}")" 2> /dev/null); do
      stat="$(cat "/proc/${pid}/stat" 2> /dev/null)" || continue
      stat="${stat##*) }"
      # state is the 1st field after the command, the process group the 3rd.
      read -r -a fields <<< "${stat}"
      [[ "${fields[0]}" == T || "${fields[2]}" != "${pid}" ]] && continue
      env="$(tr '\0' '\n' 2> /dev/null < "/proc/${pid}/environ")" || continue
      grep -qx "CHAOS_RUN=${RUN_MARK}" <<< "${env}" || continue
      job="$(sed -n 's/^COHORT_JOB_ID=//p' <<< "${env}")"
      echo "${pid} ${job} ${host}"
    done
  done
}

inject_fault() {
  local roll kind pid job host delay leader
  local -a ranks
  roll=$((RANDOM % 100))
  if ((HA)); then
    if ((roll < 18)); then kind=worker_kill; elif ((roll < 32)); then kind=worker_stop
    elif ((roll < 38)); then kind=worker_stop_brief; elif ((roll < 50)); then kind=agent_kill
    elif ((roll < 60)); then kind=agent_stop; elif ((roll < 74)); then kind=leader_kill
    elif ((roll < 86)); then kind=leader_stop
    else kind=partition; fi
  else
    if ((roll < 20)); then kind=worker_kill; elif ((roll < 38)); then kind=worker_stop
    elif ((roll < 46)); then kind=worker_stop_brief; elif ((roll < 60)); then kind=agent_kill
    elif ((roll < 72)); then kind=agent_stop; elif ((roll < 84)); then kind=coordinator_kill
    else kind=partition; fi
  fi
  tick_now
  case "${kind}" in
    worker_kill | worker_stop | worker_stop_brief)
      mapfile -t ranks < <(running_ranks)
      ((${#ranks[@]} > 0)) || return 1 # nothing runs now; try again soon
      read -r pid job host <<< "${ranks[RANDOM % ${#ranks[@]}]}"
      if [[ "${kind}" == worker_kill ]]; then
        kill -KILL "${pid}" 2> /dev/null || return 1
      else
        kill -STOP "${pid}" 2> /dev/null || return 1
      fi
      record_fault "${kind}" "${job}" "pid ${pid} of ${job} on host-${host}"
      if [[ "${kind}" == worker_stop_brief ]]; then
        PENDING_DUE=$((NOW_MS + STOPPED_LIMIT_MS / 3))
        PENDING_ACTION="cont_pid ${pid}"
      fi
      ;;
    agent_kill)
      rand "${FIRST_AGENT}" "${HOSTS}"; host="${R}"
      rand 500 3000; delay="${R}"
      refresh_list
      tick_now
      cluster_signal_daemon "${host}" KILL
      record_fault agent_kill "$(jobs_on_host "${host}")" "host-${host}'s cohortd, restart in ${delay} ms"
      PENDING_DUE=$((NOW_MS + delay))
      PENDING_ACTION="restart ${host}"
      ;;
    agent_stop)
      rand "${FIRST_AGENT}" "${HOSTS}"; host="${R}"
      rand 1000 $((LEASE_MS + 2000)); delay="${R}"
      refresh_list
      tick_now
      cluster_signal_daemon "${host}" STOP
      record_fault agent_stop "$(jobs_on_host "${host}")" "host-${host}'s cohortd for ${delay} ms (lease ${LEASE_MS} ms)"
      PENDING_DUE=$((NOW_MS + delay))
      PENDING_ACTION="cont_daemon ${host}"
      ;;
    coordinator_kill)
      rand 500 2000; delay="${R}"
      refresh_list
      tick_now
      cluster_signal_daemon 1 KILL
      record_fault coordinator_kill "$(jobs_on_host 1)" "host-1's cohortd (coordinator + agent), restart in ${delay} ms"
      PENDING_DUE=$((NOW_MS + delay))
      PENDING_ACTION="restart 1"
      ;;
    leader_kill | leader_stop)
      # Asked, not guessed: the coordinator whose health is SERVING (none during an election).
      leader="$(current_leader)" || return 1
      standby_ready "${leader}" || return 1
      if [[ "${kind}" == leader_kill ]]; then rand 500 3000; else rand 1000 8000; fi
      delay="${R}"
      tick_now
      if [[ "${kind}" == leader_kill ]]; then
        cluster_signal_daemon "${leader}" KILL
        record_fault leader_kill "" "the leader, coordinator ${leader} on host-$(_cluster_daemon_host "${leader}"), restart in ${delay} ms" "${leader}"
        PENDING_ACTION="restart ${leader}"
      else
        cluster_signal_daemon "${leader}" STOP
        record_fault leader_stop "" "the leader, coordinator ${leader} on host-$(_cluster_daemon_host "${leader}"), for ${delay} ms (etcd lease ${LEADER_LEASE_MS} ms)" "${leader}"
        PENDING_ACTION="cont_leader ${leader}"
      fi
      PENDING_DUE=$((NOW_MS + delay))
      ;;
    partition)
      rand 1 "${HOSTS}"; host="${R}"
      rand 1000 $((LEASE_MS + 3000)); delay="${R}"
      refresh_list
      leader=""
      ((HA)) && leader="$(current_leader)"
      tick_now
      cluster_partition "${host}"
      if ((HA)); then
        # The host's agent, etcd member and coordinator (the leader, maybe) are cut off; the other
        # two etcd members keep the quorum.
        if [[ -n "${leader}" && "$(_cluster_daemon_host "${leader}")" == "${host}" ]]; then
          record_fault partition "$(jobs_on_host "${host}")" "host-${host}'s link down for ${delay} ms (node lease ${LEASE_MS} ms; the leader, coordinator ${leader}, is there)" "${leader}"
        else
          record_fault partition "$(jobs_on_host "${host}")" "host-${host}'s link down for ${delay} ms (node lease ${LEASE_MS} ms)"
        fi
      else
        # Host 1 holds the coordinator: cutting it off cuts every other node off.
        record_fault partition "$(jobs_on_host "$([[ ${host} == 1 ]] && echo all || echo "${host}")")" \
          "host-${host}'s link down for ${delay} ms (lease ${LEASE_MS} ms)"
      fi
      PENDING_DUE=$((NOW_MS + delay))
      PENDING_ACTION="heal ${host}"
      ;;
  esac
  return 0
}

# Runs the pending end action of the current fault (SIGCONT, restart, heal).
end_fault() {
  local action target
  read -r action target <<< "${PENDING_ACTION}"
  case "${action}" in
    cont_pid) kill -CONT "${target}" 2> /dev/null ;;
    cont_daemon) cluster_signal_daemon "${target}" CONT ;;
    cont_leader)
      tick_now
      FAULT_CONT_MS[${#FAULT_CONT_MS[@]} - 1]="${NOW_MS}"
      cluster_signal_daemon "${target}" CONT
      ;;
    heal) cluster_heal "${target}" ;;
    restart)
      if cluster_restart_daemon "${target}"; then
        if ((target == 1 && !HA || target > 10)); then COORDINATOR_RESTARTS=$((COORDINATOR_RESTARTS + 1)); else AGENT_RESTARTS=$((AGENT_RESTARTS + 1)); fi
      else
        fail "cohortd ${target} (host-$(_cluster_daemon_host "${target}")) did not start again after its SIGKILL"
      fi
      ;;
  esac
  PENDING_DUE=0
  PENDING_ACTION=""
}

# --- the chaos phase
# With HA, the CLI waits at most 5 s for a leader: while none leads (a leader fault with the other
# coordinator restarting) the loop must go on ending faults and restarting daemons on time.
((HA)) && CCLI_TIMEOUT_S=5
tick_now
readonly START_MS="${NOW_MS}"
END_MS=$((NOW_MS + DURATION_S * 1000))
rand 2000 4000
next_fault=$((NOW_MS + R))
while tick_now && ((NOW_MS < END_MS)); do
  watch_coordinators
  refresh_list
  mapfile -t active < <(active_jobs)
  [[ -n "${GRAPH_ACTIVE_ID}" && " ${active[*]} " != *" ${GRAPH_ACTIVE_ID} "* ]] && GRAPH_ACTIVE_ID=""
  if ((${#active[@]} < MAX_ACTIVE)); then submit_one; fi
  # Now and then a client cancels one of its jobs.
  if ((${#active[@]} > 0 && RANDOM % 100 < 3)); then
    id="${active[RANDOM % ${#active[@]}]}"
    ccli cancel "${id}" > /dev/null 2>&1 && CANCELS=$((CANCELS + 1)) && cluster_log "cancelled ${id}"
  fi
  tick_now
  if ((PENDING_DUE > 0 && NOW_MS >= PENDING_DUE)); then
    end_fault
    tick_now
    rand 1500 4000
    next_fault=$((NOW_MS + R))
  elif ((PENDING_DUE == 0 && NOW_MS >= next_fault)); then
    if inject_fault; then
      rand 2000 5000
      next_fault=$((NOW_MS + R))
    else
      next_fault=$((NOW_MS + 500))
    fi
  fi
  sleep "${LOOP_SLEEP_S}"
done

# --- recovery: end the last fault, resume and heal everything, every daemon up
cluster_log "chaos over: ${#JOB_IDS[@]} jobs submitted, ${#FAULT_KIND[@]} faults; healing"
CCLI_TIMEOUT_S="${CLI_TIMEOUT_S}"
((PENDING_DUE > 0)) && end_fault
for ((host = 1; host <= HOSTS; host++)); do
  cluster_heal "${host}"
  cluster_signal_daemon "${host}" CONT 2> /dev/null
  if ! cluster_daemon_alive "${host}"; then
    fail "host-${host}'s cohortd is gone after the chaos (not killed by the test at the end)"
    cluster_restart_daemon "${host}" || fail "host-${host}'s cohortd does not start again"
  fi
done
if ((HA)); then
  for i in "${CLUSTER_HA_DAEMONS[@]}"; do cluster_signal_daemon "${i}" CONT 2> /dev/null; done
  # A leader stopped or cut off at the end steps down now: give it the time, restart it.
  sleep $((LEADER_LEASE_MS / 1000))
  watch_coordinators
  if leader_at_end="$(cluster_wait_leader 30)"; then
    cluster_log "coordinator ${leader_at_end} leads after the chaos"
  else
    fail "no coordinator leads 30 s after the faults ended"
  fi
fi
cluster_wait_nodes "${HOSTS}" 60 || fail "not every node is live again 60 s after the faults ended"

# --- drain: every job final within the deadline
tick_now
drain_start="${NOW_MS}"
deadline=$((SECONDS + DRAIN_TIMEOUT_S))
while ((SECONDS < deadline)); do
  watch_coordinators
  refresh_list
  mapfile -t active < <(active_jobs)
  ((${#active[@]} == 0)) && break
  sleep 1
done
tick_now
drain_s=$(((NOW_MS - drain_start) / 1000))
refresh_list
mapfile -t stuck < <(active_jobs)
for id in "${stuck[@]}"; do
  fail "job ${id} is stuck: $(jq -c --arg id "${id}" '.jobs[] | select(.id == $id) | {state, attempt, reason, waiting_for}' <<< "${LAST_LIST}") ${DRAIN_TIMEOUT_S} s after the faults ended"
done

# --- lost, final states, reasons
declare -A BY_STATE=() BY_REASON=()
OTHER_REASON=""
# A FAILED job's reason, by what ended its last attempt (for the figures).
failure_class() {
  case "$1" in
    *"exited with code 3"*) echo "failed on purpose" ;;
    *"sent no heartbeat"*) echo "heartbeat timeout" ;;
    *"stopped (SIGSTOP"*) echo "stopped rank killed" ;;
    *"registered without"*) echo "agent or coordinator restarted" ;;
    *"launching ranks"*) echo "launch failed" ;;
    *"signal 9"* | *SIGKILL*) echo "rank killed" ;;
    *lost* | *lease*) echo "node lost" ;;
    *) echo "other" ;;
  esac
}
lost=0
for id in "${JOB_IDS[@]}"; do
  record="$(jq -c --arg id "${id}" '.jobs[] | select(.id == $id)' <<< "${LAST_LIST}")"
  if [[ -z "${record}" ]]; then
    record="$(ccli status "${id}" -o json 2> /dev/null)"
    if [[ -z "${record}" ]]; then
      lost=$((lost + 1))
      fail "job ${id} was submitted but the coordinator does not know it (lost)"
      continue
    fi
  fi
  state="$(jq -r .state <<< "${record}")"
  reason="$(jq -r '.reason // ""' <<< "${record}")"
  BY_STATE["${state}"]=$((${BY_STATE["${state}"]:-0} + 1))
  if [[ "${state}" == FAILED ]]; then
    why="$(failure_class "${reason}")"
    BY_REASON["${why}"]=$((${BY_REASON["${why}"]:-0} + 1))
    [[ "${why}" == other && -z "${OTHER_REASON}" ]] && OTHER_REASON="${reason}"
  fi
  if [[ "${state}" == FAILED || "${state}" == CANCELLED ]] && [[ -z "${reason}" ]]; then
    fail "job ${id} is ${state} without a reason"
  fi
done
# Jobs the coordinator has that the test never got an id for (a submit whose answer was lost).
extra="$(jq -r '.jobs[] | select(.state != "SUCCEEDED" and .state != "FAILED" and .state != "CANCELLED") | .id' <<< "${LAST_LIST}" | tr '\n' ' ')"
[[ -z "${extra// /}" ]] || fail "jobs not final at the end: ${extra}"
unknown_ids=$(($(jq '.jobs | length' <<< "${LAST_LIST}") - ${#JOB_IDS[@]}))
job_restarts="$(jq --argjson ids "$(printf '%s\n' "${JOB_IDS[@]}" | jq -R . | jq -s .)" \
  '[.jobs[] | select(.id as $i | $ids | index($i)) | (.attempt // 1) - 1 | if . < 0 then 0 else . end] | add // 0' <<< "${LAST_LIST}")"

# --- no slot leaked
leak_report=""
deadline=$((SECONDS + 15))
while ((SECONDS < deadline)); do
  leak_report="$(ccli nodes -o json 2> /dev/null |
    jq -r '.nodes[] | select((.node.free_slots // 0) != (.node.slots // 0)) | "\(.node.node_id): \(.node.free_slots // 0) of \(.node.slots // 0) slots free"' 2> /dev/null)"
  [[ -z "${leak_report}" ]] && break
  sleep 1
done
leaked_slots=0
if [[ -n "${leak_report}" ]]; then
  leaked_slots="$(wc -l <<< "${leak_report}")"
  fail "slots leaked after every job ended: ${leak_report//$'\n'/; }"
fi

# --- no orphaned process: in the hosts' namespaces only the cluster's daemons are left (cohortd;
# with HA the coordinators and etcd members too), and nowhere on the machine a process carries the
# run's marker.
declare -A DAEMON_PID=()
for pid in "${CLUSTER_DAEMON_PIDS[@]}" "${CLUSTER_ETCD_PIDS[@]}"; do DAEMON_PID["${pid}"]=1; done
orphans=""
deadline=$((SECONDS + 10))
while ((SECONDS < deadline)); do
  orphans=""
  for ((host = 1; host <= HOSTS; host++)); do
    for pid in $(ip netns pids "$(cluster_host_ns "${host}")" 2> /dev/null); do
      [[ -n "${DAEMON_PID[${pid}]:-}" ]] && continue
      orphans+="host-${host} pid ${pid} ($(tr '\0' ' ' 2> /dev/null < "/proc/${pid}/cmdline")); "
    done
  done
  for environ in /proc/[0-9]*/environ; do
    if grep -qsz "^CHAOS_RUN=${RUN_MARK}\$" "${environ}"; then
      pid="${environ#/proc/}"
      pid="${pid%/environ}"
      [[ "${orphans}" == *"pid ${pid} "* ]] || orphans+="pid ${pid} ($(tr '\0' ' ' 2> /dev/null < "/proc/${pid}/cmdline")); "
    fi
  done
  [[ -z "${orphans}" ]] && break
  sleep 1
done
orphan_count=0
if [[ -n "${orphans}" ]]; then
  orphan_count="$(grep -o 'pid [0-9]* ' <<< "${orphans}" | wc -l)"
  fail "processes left after every job ended: ${orphans}"
fi

# --- detection latency: fault -> the coordinator's state change of an affected job's attempt away
# from RUNNING/PLACED (not to SUCCEEDED), from its log (appended across restarts).
changes="${CLUSTER_TMP}/changes.txt"
# With HA every coordinator's log, in time order (each led for a while).
if ((HA)); then
  COORDINATOR_LOGS=()
  for i in "${CLUSTER_HA_DAEMONS[@]}"; do COORDINATOR_LOGS+=("${CLUSTER_TMP}/cohortd-${i}.log"); done
else
  COORDINATOR_LOGS=("${CLUSTER_TMP}/cohortd-1.log")
fi
# Lines "MS|rest" of the coordinators' logs matching a sed -E substitution that prints "TIME|rest".
log_times() {
  local raw
  raw="$(sed -nE "$1" "${COORDINATOR_LOGS[@]}")"
  [[ -n "${raw}" ]] || return 0
  paste -d '|' <(cut -d '|' -f 1 <<< "${raw}" | date -f - +%s%3N 2> /dev/null) <(cut -d '|' -f 2- <<< "${raw}") | sort -t '|' -k 1,1n
}
log_times 's/^\[([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]+)\].*coordinator: job ([^ ]+) attempt ([0-9]+): (RUNNING|PLACED) -> (PENDING|FAILED|PLACED): .*/\1|\2|\5/p' > "${changes}"
declare -a WORKER_LATENCIES=() NODE_LATENCIES=()
not_noticed=0
for ((f = 0; f < ${#FAULT_KIND[@]}; f++)); do
  kind="${FAULT_KIND[f]}"
  [[ "${kind}" == worker_stop_brief ]] && continue # must not be noticed
  [[ "${kind}" == leader_* ]] && continue          # no job is meant to notice: failover below
  best=""
  for job in ${FAULT_JOBS[f]}; do
    t="$(awk -F '|' -v job="${job}" -v t0="${FAULT_T0[f]}" '$2 == job && $1 >= t0 { print $1; exit }' "${changes}")"
    [[ -n "${t}" ]] && { [[ -z "${best}" ]] || ((t < best)); } && best="${t}"
  done
  if [[ -z "${best}" ]]; then
    not_noticed=$((not_noticed + 1))
    continue
  fi
  latency=$((best - FAULT_T0[f]))
  # A state change long after the fault belongs to something else (the job's next attempt).
  ((latency > 60000)) && { not_noticed=$((not_noticed + 1)); continue; }
  case "${kind}" in
    worker_*)
      WORKER_LATENCIES+=("${latency}")
      ((latency <= WORKER_DETECT_BOUND_S * 1000)) ||
        fail "${kind} (${FAULT_WHAT[f]}) was noticed only after ${latency} ms (bound ${WORKER_DETECT_BOUND_S} s)"
      ;;
    *) NODE_LATENCIES+=("${latency}") ;;
  esac
done
# --- HA: failover time (a leader fault -> the first "leads the cluster now" of a coordinator after
# it, before the next fault), and the step-down of a stopped leader that was replaced.
declare -a FAILOVER_MS=() STEPDOWN_MS=()
no_failover=0
if ((HA)); then
  leads="${CLUSTER_TMP}/leads.txt"
  log_times 's/^\[([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]+)\].*cohortd at ([^ ]+) leads the cluster now.*/\1|\2/p' > "${leads}"
  for ((f = 0; f < ${#FAULT_KIND[@]}; f++)); do
    [[ -n "${FAULT_LEADER[f]}" ]] || continue
    kind="${FAULT_KIND[f]}"
    t0="${FAULT_T0[f]}"
    t_next="$( ((f + 1 < ${#FAULT_KIND[@]})) && echo "${FAULT_T0[f + 1]}" || echo 99999999999999)"
    t="$(awk -F '|' -v t0="${t0}" -v t1="${t_next}" '$1 >= t0 && $1 < t1 { print $1; exit }' "${leads}")"
    if [[ -z "${t}" ]]; then
      # The old leader kept leading: only a stop or cut shorter than the etcd lease may do that.
      if [[ "${kind}" == leader_kill ]]; then
        fail "nobody led again after ${kind} (${FAULT_WHAT[f]}) before the next fault"
      fi
      no_failover=$((no_failover + 1))
      continue
    fi
    FAILOVER_MS+=($((t - t0)))
    ((t - t0 <= FAILOVER_BOUND_S * 1000)) || fail "${kind} (${FAULT_WHAT[f]}): a coordinator led again only after $((t - t0)) ms (bound ${FAILOVER_BOUND_S} s)"
    if [[ "${kind}" == leader_stop && -n "${FAULT_CONT_MS[f]}" ]]; then
      # Replaced while stopped: after its SIGCONT it must say it lost the leadership (and exit).
      if ((t < FAULT_CONT_MS[f])); then
        down="$(sed -nE 's/^\[([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]+)\].* lost its leadership.*/\1/p' \
          "${CLUSTER_TMP}/cohortd-${FAULT_LEADER[f]}.log" | date -f - +%s%3N 2> /dev/null |
          awk -v c="${FAULT_CONT_MS[f]}" '$1 >= c { print $1; exit }')"
        if [[ -z "${down}" ]]; then
          fail "leader_stop (${FAULT_WHAT[f]}): replaced while stopped, it never logged that it lost its leadership after its SIGCONT"
        else
          STEPDOWN_MS+=($((down - FAULT_CONT_MS[f])))
          ((down - FAULT_CONT_MS[f] <= STEPDOWN_BOUND_S * 1000)) ||
            fail "leader_stop (${FAULT_WHAT[f]}): it stepped down only $((down - FAULT_CONT_MS[f])) ms after its SIGCONT (bound ${STEPDOWN_BOUND_S} s)"
        fi
      fi
    fi
  done
fi

stats() { # "n N, median M ms, max X ms" of the arguments
  (($# == 0)) && { echo "n 0"; return; }
  printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "n %d, median %d ms, max %d ms", NR, m, v[NR] }'
}

# The ranks the brief stops hit must have been forgiven: their jobs were not failed by the stop.
# (Checked via the latency scan above: a brief stop is skipped there; nothing more to assert.)

# --- cleanup, then nothing of the run may remain
if ((failed != 0)); then
  cluster_dump_logs
  # Under bazel test, keep the daemons' whole logs (bazel-testlogs/.../test.outputs/).
  [[ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ]] && cp "${CLUSTER_TMP}"/cohortd-*.log "${CLUSTER_TMP}"/etcd-*.log "${TEST_UNDECLARED_OUTPUTS_DIR}/" 2> /dev/null
fi
cluster_cleanup
# How the cohortds ended at the cleanup's SIGTERM (they are this script's children; one already
# reaped answers 127). SIGKILL is the cleanup's own last resort (a stopped one, one slow to drain);
# any other signal is a crash: gRPC 1.51's retry filter once aborted cohortds here (SIGABRT, see
# worker/base/tls.cc).
for i in "${!CLUSTER_DAEMON_PIDS[@]}"; do
  wait "${CLUSTER_DAEMON_PIDS[i]}" 2> /dev/null
  rc=$?
  if ((rc > 128 && rc != 137)); then
    fail "cohortd ${i} (pid ${CLUSTER_DAEMON_PIDS[i]}) ended with signal $((rc - 128)) ($(kill -l $((rc - 128)) 2> /dev/null)) at the cleanup; the end of its log:"
    tail -n 5 "${CLUSTER_TMP}/cohortd-${i}.log"
  elif ((rc != 0 && rc != 127)); then
    cluster_log "cohortd ${i} exited ${rc} at the cleanup"
  fi
done
# COHORT_CHAOS_LOG_DIR=DIR keeps every daemon's log there, pass or fail (after the cleanup: with
# what the daemons logged as they stopped).
if [[ -n "${COHORT_CHAOS_LOG_DIR:-}" ]]; then
  mkdir -p "${COHORT_CHAOS_LOG_DIR}" && cp "${CLUSTER_TMP}"/cohortd-*.log "${CLUSTER_TMP}"/etcd-*.log "${COHORT_CHAOS_LOG_DIR}/" 2> /dev/null
fi
CLUSTER_ID_DONE="${CLUSTER_ID}"
CLUSTER_ID="" # the EXIT trap has nothing left to do but remove CLUSTER_TMP
leftover_ns="$(ip netns list 2> /dev/null | awk '{print $1}' | grep "^${CLUSTER_PREFIX}-${CLUSTER_ID_DONE}-" | tr '\n' ' ')"
[[ -z "${leftover_ns}" ]] || fail "namespaces left after cleanup: ${leftover_ns}"
[[ ! -e "${CLUSTER_RUN_ROOT}/${CLUSTER_ID_DONE}" ]] || fail "${CLUSTER_RUN_ROOT}/${CLUSTER_ID_DONE} left after cleanup"
# (A cohortd of the run names its data directory under CLUSTER_TMP; read with tr, whose own command
# line does not.)
for cmdline in /proc/[0-9]*/cmdline; do
  command_line="$(tr '\0' ' ' 2> /dev/null < "${cmdline}")"
  if [[ "${command_line}" == *"${CLUSTER_TMP}"* ]] || grep -qsz "^CHAOS_RUN=${RUN_MARK}\$" "${cmdline%cmdline}environ"; then
    fail "process left after cleanup: ${cmdline%/cmdline} (${command_line})"
  fi
done

# --- figures
tick_now
faults_line=""
if ((HA)); then fault_kinds="worker_kill worker_stop worker_stop_brief agent_kill agent_stop leader_kill leader_stop partition"
else fault_kinds="worker_kill worker_stop worker_stop_brief agent_kill agent_stop coordinator_kill partition"; fi
for kind in ${fault_kinds}; do
  faults_line+=" ${kind} ${FAULT_COUNT[${kind}]:-0},"
done
declare -A BY_KIND=()
for id in "${JOB_IDS[@]}"; do BY_KIND["${JOB_KIND[${id}]}"]=$((${BY_KIND["${JOB_KIND[${id}]}"]:-0} + 1)); done
cat << FIGURES
chaos figures (seed ${SEED}, ${DURATION_S} s of faults, ${MODE}, ${HOSTS} hosts x ${SLOTS} slots, node lease ${LEASE_MS} ms,$( ((HA)) && echo " etcd leader lease ${LEADER_LEASE_MS} ms,") stopped_task_limit ${STOPPED_LIMIT_MS} ms, heartbeat ${HEARTBEAT_INTERVAL_MS}/${HEARTBEAT_TIMEOUT_MS} ms):
  jobs run: ${#JOB_IDS[@]} (ok ${BY_KIND[ok]:-0}, fail-on-purpose ${BY_KIND[fail]:-0}, hang ${BY_KIND[hang]:-0}, graph ${BY_KIND[graph]:-0}); final: SUCCEEDED ${BY_STATE[SUCCEEDED]:-0}, FAILED ${BY_STATE[FAILED]:-0}, CANCELLED ${BY_STATE[CANCELLED]:-0}; cancelled by the client ${CANCELS}; submits refused while the coordinator was down ${SUBMIT_FAILURES}; jobs the coordinator has beyond those ${unknown_ids}
  FAILED jobs by what ended them:$(for why in "${!BY_REASON[@]}"; do printf ' %s %d,' "${why}" "${BY_REASON[${why}]}"; done | sed 's/,$//')${OTHER_REASON:+ (other, e.g.: ${OTHER_REASON})}
  faults injected: ${#FAULT_KIND[@]} (${faults_line%,} )
  restarts: job attempts restarted ${job_restarts}; cohortd restarted: agents ${AGENT_RESTARTS}, coordinator ${COORDINATOR_RESTARTS}$( ((HA)) && echo " (killed leaders), ${STEPDOWN_RESTARTS} coordinators that stepped down and exited 1")
FIGURES
if ((HA)); then
  cat << FIGURES
  failover (leader killed, stopped or cut off -> another coordinator leads, from its log): $(stats "${FAILOVER_MS[@]}"); leader faults with no failover (stopped or cut off shorter than the etcd lease) ${no_failover}
  step-down of a replaced stopped leader after its SIGCONT: $(stats "${STEPDOWN_MS[@]}"); probe rounds with two coordinators SERVING ${DUAL_ROUNDS} (longest ${DUAL_MAX_MS} ms, bound ${SPLIT_BRAIN_BOUND_MS} ms)
FIGURES
fi
cat << FIGURES
  detection latency, rank faults (kill; stop left stopped): $(stats "${WORKER_LATENCIES[@]}")
  detection latency, node faults (agent kill/stop, $( ((HA)) || echo "coordinator kill, ")partition; the lease or a restart is what notices): $(stats "${NODE_LATENCIES[@]}")
  faults that changed no job (brief stops, a stop or cut shorter than the lease, nothing running there): $((not_noticed + ${FAULT_COUNT[worker_stop_brief]:-0}))
  drain after the faults: ${drain_s} s; stuck ${#stuck[@]}; lost ${lost}; leaked slots ${leaked_slots}; orphaned processes ${orphan_count}
  wall time: $(((NOW_MS - START_MS) / 1000)) s after the cluster was up
FIGURES
((failed == 0)) || echo "chaos: FAILED (seed ${SEED}; replay: ${REPLAY})"
exit "${failed}"
