#!/bin/bash
# Three simulated hosts (tests/cluster/lib.sh: a network and a UTS namespace each, one cohortd per
# host, the coordinator on host-1), one slot each:
#  1. a graph job of 3 nodes x 1 rank trains with real cohort-worker processes that talk UCX over
#     TCP between the namespaces' addresses: it SUCCEEDS, its placement spans host-1..3 at their
#     own addresses, and each rank's UCX log shows its own host name and a tcp/eth0 endpoint;
#  2. a command job prints each rank's host name and MASTER_ADDR: every rank ran on the host its
#     placement names, and MASTER_ADDR is host-1's (node rank 0's registered) address.
set -u
source "$(dirname "$0")/lib.sh"
cluster_init || exit 0

failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}
# Bounds for one job here: worker start-up (libtorch) on a busy 2-core machine, not training.
readonly JOB_TIMEOUT_S=60

cluster_start 3 1 || { cluster_dump_logs; exit 1; }

# The rank that each node of a placement runs (1 rank per node here), as "rank node address" lines.
placement_lines() { cluster_job_json "$1" | jq -r '.placement.nodes[] | "\(.first_rank) \(.node_id) \(.address)"'; }

# Checks that the placement of job $1 puts rank r on a different host each, at that host's address.
check_placement() {
  local id="$1" rank node address hosts
  hosts="$(placement_lines "${id}" | awk '{print $2}' | sort -u | tr '\n' ' ')"
  [[ "${hosts}" == "host-1 host-2 host-3 " ]] || fail "${id} is placed on '${hosts}', not host-1..3"
  while read -r rank node address; do
    [[ "${address%:*}" == "$(cluster_host_addr "${node#host-}")" ]] ||
      fail "${id}: node ${node} registered ${address}, not its namespace address $(cluster_host_addr "${node#host-}")"
  done < <(placement_lines "${id}")
}

# --- 1. a graph job over UCX between the hosts
cat > "${CLUSTER_TMP}/graph.yaml" <<'SPEC'
name: cluster-graph
nodes: 3
procs_per_node: 1
communicator: flat
# UCX prints the transport of each endpoint (ep_cfg) at info level, tagged [host:pid:thread] (the pid
# padded with spaces).
env: {UCX_LOG_LEVEL: info}
dataset: {kind: synthetic, train_size: 96, test_size: 48, input_shape: [1, 8, 8], num_classes: 4}
data_parallel:
  graph:
    layers:
      - {type: flatten}
      - {type: linear, in_features: 64, out_features: 16}
      - {type: relu}
      - {type: linear, in_features: 16, out_features: 4}
loss: cross_entropy
optimizer: {kind: momentum, lr: 0.1, momentum: 0.9}
batch_size: 16
epochs: 2
seed: 3
restart_policy: {max_restarts: 0}
SPEC
graph="$(cluster_submit "${CLUSTER_TMP}/graph.yaml")"
[[ -n "${graph}" ]] || { cluster_dump_logs; echo "FAIL: the graph job was not submitted"; exit 1; }
state="$(cluster_wait_job "${graph}" "SUCCEEDED FAILED CANCELLED" "${JOB_TIMEOUT_S}")"
[[ "${state}" == SUCCEEDED ]] || fail "graph job ${graph} is ${state}: $(cluster_job_json "${graph}" | jq -r .reason)"
check_placement "${graph}"
while read -r rank node address; do
  log="$(cluster_cli logs "${graph}" --rank "${rank}")"
  grep -q "\[${node}:[0-9 ]*:[0-9]*\] .*UCX" <<< "${log}" || fail "rank ${rank}'s UCX log is not tagged with host name ${node}; its log:"$'\n'"${log}"
  grep -q "ep_cfg\[[0-9]*\]: tag(tcp/eth0)" <<< "${log}" ||
    fail "rank ${rank} on ${node} did not talk UCX over tcp/eth0 (its namespace address); its log:"$'\n'"${log}"
  if [[ "${rank}" == 0 ]]; then
    grep -q '^test accuracy [0-9]\.[0-9]\{4\}$' <<< "${log}" || fail "rank 0 printed no 'test accuracy' line"
  fi
done < <(placement_lines "${graph}")

# --- 2. a command job: each rank prints where it runs
cat > "${CLUSTER_TMP}/hostname.yaml" <<'SPEC'
name: cluster-hostname
nodes: 3
procs_per_node: 1
command: [/bin/sh, -c, 'echo "rank $RANK host $(hostname) master $MASTER_ADDR"']
restart_policy: {max_restarts: 0}
SPEC
command_job="$(cluster_submit "${CLUSTER_TMP}/hostname.yaml")"
state="$(cluster_wait_job "${command_job}" "SUCCEEDED FAILED CANCELLED" "${JOB_TIMEOUT_S}")"
[[ "${state}" == SUCCEEDED ]] ||
  fail "command job ${command_job} is ${state}: $(cluster_job_json "${command_job}" | jq -r .reason)"
check_placement "${command_job}"
while read -r rank node address; do
  line="$(cluster_cli logs "${command_job}" --rank "${rank}" | grep '^rank ')"
  expected="rank ${rank} host ${node} master $(cluster_host_addr 1)"
  [[ "${line}" == "${expected}" ]] || fail "rank ${rank} printed '${line}', expected '${expected}'"
done < <(placement_lines "${command_job}")

((failed == 0)) || cluster_dump_logs
exit ${failed}
