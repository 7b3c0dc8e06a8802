#include "daemon/service/coordinator_proto.h"

#include <google/protobuf/timestamp.pb.h>

namespace cohort::daemon {
namespace {

using coordinator::JobState;

// Leaves `out` unset for 0 (the records' "never").
void set_timestamp(int64_t unix_ms, google::protobuf::Timestamp* out) {
  out->set_seconds(unix_ms / 1000);
  out->set_nanos(static_cast<int32_t>((unix_ms % 1000) * 1000000));
}

}  // namespace

cohort::v1::JobState to_proto(JobState state) {
  switch (state) {
    case JobState::kPending:
      return cohort::v1::PENDING;
    case JobState::kPlaced:
      return cohort::v1::PLACED;
    case JobState::kRunning:
      return cohort::v1::RUNNING;
    case JobState::kSucceeded:
      return cohort::v1::SUCCEEDED;
    case JobState::kFailed:
      return cohort::v1::FAILED;
    case JobState::kCancelled:
      return cohort::v1::CANCELLED;
  }
  return cohort::v1::JOB_STATE_UNSPECIFIED;
}

StatusOr<JobState> from_proto(cohort::v1::JobState state) {
  switch (state) {
    case cohort::v1::PENDING:
      return JobState::kPending;
    case cohort::v1::PLACED:
      return JobState::kPlaced;
    case cohort::v1::RUNNING:
      return JobState::kRunning;
    case cohort::v1::SUCCEEDED:
      return JobState::kSucceeded;
    case cohort::v1::FAILED:
      return JobState::kFailed;
    case cohort::v1::CANCELLED:
      return JobState::kCancelled;
    default:
      break;
  }
  return invalid_argument_error(
      "job state {} is not one of PENDING, PLACED, RUNNING, SUCCEEDED, FAILED, CANCELLED",
      static_cast<int>(state));
}

coordinator::NodeInfo from_proto(const cohort::v1::NodeInfo& node) {
  coordinator::NodeInfo info;
  info.node_id = node.node_id();
  info.address = node.address();
  info.hostname = node.hostname();
  info.cores = node.cores();
  info.memory_bytes = node.memory_bytes();
  info.slots = node.slots();
  for (const cohort::v1::Gpu& gpu : node.gpus()) {
    info.gpus.push_back(coordinator::GpuInfo{gpu.index(), gpu.model(), gpu.memory_bytes()});
  }
  return info;
}

void to_proto(const coordinator::NodeInfo& node, cohort::v1::NodeInfo* out) {
  out->set_node_id(node.node_id);
  out->set_address(node.address);
  out->set_hostname(node.hostname);
  out->set_cores(node.cores);
  out->set_memory_bytes(node.memory_bytes);
  out->set_slots(node.slots);
  for (const coordinator::GpuInfo& gpu : node.gpus) {
    cohort::v1::Gpu* g = out->add_gpus();
    g->set_index(gpu.index);
    g->set_model(gpu.model);
    g->set_memory_bytes(gpu.memory_bytes);
  }
}

void to_proto(const coordinator::NodeStatus& status, coordinator::TimePoint now,
              cohort::v1::NodeStatus* out) {
  to_proto(status.info, out->mutable_node());
  out->mutable_node()->set_free_slots(status.free_slots);
  const auto left = std::chrono::duration_cast<coordinator::Duration>(status.lease_expiry - now);
  out->set_lease_remaining_ms(left.count() > 0 ? left.count() : 0);
  for (int gpu : status.free_gpus) out->add_free_gpus(gpu);
  out->set_draining(status.unschedulable);
  out->set_suspect_reason(status.suspect_reason);
  out->set_awaiting_registration(status.awaiting_registration);
}

coordinator::Metrics from_proto(const cohort::v1::Metrics& metrics) {
  coordinator::Metrics m;
  m.step = metrics.step();
  m.epoch = metrics.epoch();
  m.loss = metrics.loss();
  m.accuracy = metrics.accuracy();
  m.samples_per_s = metrics.samples_per_s();
  m.rank = metrics.rank();
  m.total_steps = metrics.total_steps();
  m.total_epochs = metrics.total_epochs();
  m.samples_per_step = metrics.samples_per_step();
  m.comm_wait_s = metrics.comm_wait_s();
  m.comm_wait_ratio = metrics.comm_wait_ratio();
  return m;
}

void to_proto(const coordinator::Metrics& metrics, cohort::v1::Metrics* out) {
  out->set_step(metrics.step);
  out->set_epoch(metrics.epoch);
  out->set_loss(metrics.loss);
  out->set_accuracy(metrics.accuracy);
  out->set_samples_per_s(metrics.samples_per_s);
  out->set_rank(metrics.rank);
  out->set_total_steps(metrics.total_steps);
  out->set_total_epochs(metrics.total_epochs);
  out->set_samples_per_step(metrics.samples_per_step);
  out->set_comm_wait_s(metrics.comm_wait_s);
  out->set_comm_wait_ratio(metrics.comm_wait_ratio);
}

void to_proto(const coordinator::Placement& placement, cohort::v1::Placement* out) {
  int world_size = 0;
  for (const coordinator::NodeAssignment& node : placement.nodes) {
    cohort::v1::NodeAssignment* n = out->add_nodes();
    n->set_node_id(node.node_id);
    n->set_address(node.address);
    n->set_node_rank(node.node_rank);
    n->set_first_rank(node.first_rank);
    n->set_num_ranks(node.num_ranks);
    for (int gpu : node.gpus) n->add_gpus(gpu);
    world_size += node.num_ranks;
  }
  out->set_world_size(world_size);
}

void to_proto(const coordinator::Job& job, cohort::v1::JobRecord* out) {
  out->set_id(job.id);
  out->set_owner(job.owner);
  *out->mutable_spec() = job.spec;
  out->set_state(to_proto(job.state()));
  out->set_reason(job.machine.reason());
  out->set_attempt(job.attempt());
  if (!job.placement.empty()) to_proto(job.placement, out->mutable_placement());
  if (job.submit_unix_ms != 0) set_timestamp(job.submit_unix_ms, out->mutable_submit_time());
  if (job.start_unix_ms != 0) set_timestamp(job.start_unix_ms, out->mutable_start_time());
  if (job.end_unix_ms != 0) set_timestamp(job.end_unix_ms, out->mutable_end_time());
  if (job.last_metrics.has_value()) to_proto(*job.last_metrics, out->mutable_last_metrics());
  out->set_waiting_for(job.waiting_for);
}

void to_proto(const coordinator::JobEvent& event, cohort::v1::JobEvent* out) {
  out->set_seq(event.seq);
  out->set_job_id(event.job_id);
  set_timestamp(event.unix_ms, out->mutable_time());
  switch (event.kind) {
    case coordinator::JobEvent::Kind::kStateChange: {
      cohort::v1::StateChange* change = out->mutable_state_change();
      change->set_from(to_proto(event.change.from));
      change->set_to(to_proto(event.change.to));
      change->set_attempt(event.change.attempt);
      change->set_reason(event.change.reason);
      break;
    }
    case coordinator::JobEvent::Kind::kMetrics:
      to_proto(event.metrics, out->mutable_metrics());
      break;
  }
}

}  // namespace cohort::daemon
