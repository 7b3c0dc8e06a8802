#!/bin/bash
# Restart and resume when a whole host is taken away (issue 16), on three simulated hosts
# (tests/cluster/lib.sh), one slot each, node lease 4 s. Graph jobs checkpoint every epoch into a
# directory every host sees (as a cluster's shared file system; allowed_path_roots names it) with
# max_restarts: 2 and from_checkpoint: true.
#  1. It fits elsewhere: a job of 2 nodes runs on two hosts; once both ranks checkpointed, the link
#     of the one that is not host-1 (the coordinator's) goes down. The job restarts on the two
#     remaining hosts (the cut-off host is not in the new placement), resumes from a checkpoint
#     (rank 0's log of the new attempt says from which step) and SUCCEEDS.
#  2. It does not fit: a job of 3 nodes runs on all three; host-3's link goes down. The restart
#     stays PENDING, saying what it waits for, as long as host-3 is away; once the link is back,
#     host-3 registers again and the job runs there too, resumes and SUCCEEDS.
set -u
source "$(dirname "$0")/lib.sh"
cluster_init || exit 0

failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}
readonly LEASE_MS=4000
# Worker start-up (libtorch) and training on a busy 2-core machine, restarts included.
readonly JOB_TIMEOUT_S=120
# How long the second job must stay queued while host-3 is away: more than a lease and a tick.
readonly QUEUED_FOR_S=8
readonly REREGISTER_BOUND_S=20

# The shared checkpoint root; the job's user (cohort-job) writes there.
readonly SHARED="${CLUSTER_TMP}/shared"
mkdir -p "${SHARED}"
chown cohort-job: "${SHARED}" || { echo "FAIL: cannot hand ${SHARED} to cohort-job"; exit 1; }
cat > "${CLUSTER_TMP}/cohortd.yaml" << CONFIG
allowed_path_roots: [${SHARED}]
CONFIG

# shellcheck disable=SC2034  # read by cluster_start
CLUSTER_COORDINATOR_FLAGS="--node-lease-ms ${LEASE_MS} --tick-interval-ms 100"
# shellcheck disable=SC2034  # read by cluster_start
CLUSTER_DAEMON_FLAGS="--peer-rpc-timeout-ms 1000 --config ${CLUSTER_TMP}/cohortd.yaml"
cluster_start 3 1 || { cluster_dump_logs; exit 1; }

# A graph job of `nodes` x 1 rank, checkpointing into ${SHARED}/<name>.
write_job() {
  local name="$1" nodes="$2"
  cat > "${CLUSTER_TMP}/${name}.yaml" << SPEC
name: ${name}
nodes: ${nodes}
procs_per_node: 1
communicator: flat
dataset: {kind: synthetic, train_size: 1536, test_size: 48, input_shape: [32], num_classes: 4}
data_parallel:
  graph:
    layers:
      - {type: linear, in_features: 32, out_features: 16}
      - {type: relu}
      - {type: linear, in_features: 16, out_features: 4}
loss: cross_entropy
optimizer: {kind: momentum, lr: 0.05, momentum: 0.9}
batch_size: 8
epochs: 6
seed: 5
checkpoint: {dir: ${SHARED}/${name}, interval_epochs: 1}
restart_policy: {max_restarts: 2, from_checkpoint: true}
SPEC
}

# Waits until every one of `ranks` ranks has a checkpoint file in directory $1.
wait_for_checkpoints() {
  local dir="$1" ranks="$2" deadline=$((SECONDS + JOB_TIMEOUT_S)) r have
  while ((SECONDS < deadline)); do
    have=0
    for ((r = 0; r < ranks; r++)); do
      compgen -G "${dir}/*.rank${r}of${ranks}.pt" > /dev/null && have=$((have + 1))
    done
    ((have == ranks)) && return 0
    sleep 0.1
  done
  return 1
}

placed_hosts() { cluster_job_json "$1" | jq -r '.placement.nodes[].node_id' | sort | tr '\n' ' '; }

# Rank 0's log of attempt $2 must say it resumed from a checkpoint; prints the step.
check_resumed() {
  local id="$1" attempt="$2" log step
  log="$(cluster_cli logs "${id}" --rank 0 --attempt "${attempt}")"
  step="$(sed -n 's/.*resumed from the checkpoint of step \([0-9]*\).*/\1/p' <<< "${log}" | tail -n 1)"
  if [[ -z "${step}" || "${step}" == 0 ]]; then
    fail "${id} attempt ${attempt} did not resume from a checkpoint; rank 0's log:"$'\n'"$(tail -n 20 <<< "${log}")"
  else
    cluster_log "${id} attempt ${attempt} resumed from step ${step}"
  fi
}

# --- 1. the restart fits on the remaining hosts
write_job fits 2
job="$(cluster_submit "${CLUSTER_TMP}/fits.yaml")"
[[ -n "${job}" ]] || { cluster_dump_logs; echo "FAIL: job fits was not submitted"; exit 1; }
state="$(cluster_wait_job "${job}" RUNNING "${JOB_TIMEOUT_S}")" ||
  { cluster_dump_logs; echo "FAIL: ${job} is ${state}, never RUNNING"; exit 1; }
wait_for_checkpoints "${SHARED}/fits" 2 || fail "${job}: no checkpoint of both ranks"
before="$(placed_hosts "${job}")"
victim="$(tr ' ' '\n' <<< "${before}" | grep -v '^host-1$' | head -n 1)"
cluster_log "${job} runs on ${before}; taking ${victim} away"
cluster_partition "${victim#host-}"
state="$(cluster_wait_job "${job}" "SUCCEEDED FAILED CANCELLED" "${JOB_TIMEOUT_S}")"
json="$(cluster_job_json "${job}")"
[[ "${state}" == SUCCEEDED ]] || fail "${job} is ${state} after ${victim} went away: $(jq -r .reason <<< "${json}")"
attempt="$(jq -r .attempt <<< "${json}")"
after="$(placed_hosts "${job}")"
((attempt >= 2)) || fail "${job} ended on attempt ${attempt}: losing ${victim} did not restart it"
[[ "${after}" != *"${victim}"* ]] || fail "${job}'s attempt ${attempt} was placed on ${after}, including the lost ${victim}"
[[ "$(wc -w <<< "${after}")" == 2 ]] || fail "${job}'s attempt ${attempt} is placed on '${after}'"
cluster_log "${job}: attempt 1 on ${before}; attempt ${attempt} on ${after}: ${state}"
check_resumed "${job}" "${attempt}"
cluster_heal "${victim#host-}"
cluster_wait_nodes 3 "${REREGISTER_BOUND_S}" || fail "${victim} did not register again after the heal"

# --- 2. the restart does not fit: it waits for the host to come back
write_job waits 3
job="$(cluster_submit "${CLUSTER_TMP}/waits.yaml")"
[[ -n "${job}" ]] || { cluster_dump_logs; echo "FAIL: job waits was not submitted"; exit 1; }
state="$(cluster_wait_job "${job}" RUNNING "${JOB_TIMEOUT_S}")" ||
  { cluster_dump_logs; echo "FAIL: ${job} is ${state}, never RUNNING"; exit 1; }
wait_for_checkpoints "${SHARED}/waits" 3 || fail "${job}: no checkpoint of all three ranks"
cluster_partition 3
cluster_log "host-3 taken away while ${job} runs"
state="$(cluster_wait_job "${job}" "PENDING FAILED SUCCEEDED" "$((LEASE_MS / 1000 + 6))")"
[[ "${state}" == PENDING ]] || fail "${job} is ${state} after host-3 went away, expected PENDING (a restart)"
sleep "${QUEUED_FOR_S}"
json="$(cluster_job_json "${job}")"
state="$(jq -r .state <<< "${json}")"
waiting="$(jq -r '.waiting_for // ""' <<< "${json}")"
[[ "${state}" == PENDING ]] || fail "${job} is ${state} while host-3 is away; it needs 3 nodes and has 2"
[[ -n "${waiting}" ]] || fail "${job} waits without saying for what"
cluster_log "${job} is ${state} with host-3 away: ${waiting}"
cluster_heal 3
state="$(cluster_wait_job "${job}" "SUCCEEDED FAILED CANCELLED" "${JOB_TIMEOUT_S}")"
json="$(cluster_job_json "${job}")"
[[ "${state}" == SUCCEEDED ]] || fail "${job} is ${state} after host-3 returned: $(jq -r .reason <<< "${json}")"
attempt="$(jq -r .attempt <<< "${json}")"
((attempt >= 2)) || fail "${job} ended on attempt ${attempt}"
[[ "$(placed_hosts "${job}")" == "host-1 host-2 host-3 " ]] || fail "${job} ended on '$(placed_hosts "${job}")'"
check_resumed "${job}" "${attempt}"

((failed == 0)) || cluster_dump_logs
exit ${failed}
