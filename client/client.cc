#include "client/client.h"

#include <cstdlib>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "daemon/service/grpc_status.h"

namespace cohort::client {
namespace {

bool is_final(cohort::v1::JobState state) {
  return state == cohort::v1::SUCCEEDED || state == cohort::v1::FAILED || state == cohort::v1::CANCELLED;
}

}  // namespace

std::string default_coordinator_address() {
  const char* env = std::getenv("COHORT_COORDINATOR");
  return env != nullptr && *env != '\0' ? env : kDefaultCoordinatorAddress;
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(kKeepaliveTime.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(kKeepaliveTimeout.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A watch can be silent for hours: keep pinging however long no data flows (default: 2 pings).
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

Client::Client(const std::string& address, ClientOptions options)
    : address_(address),
      options_(options),
      channel_(make_channel(address)),
      info_(cohort::v1::Info::NewStub(channel_)),
      coordinator_(cohort::v1::Coordinator::NewStub(channel_)) {}

void Client::set_deadline(grpc::ClientContext* context) const {
  context->set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
}

Status Client::rpc_error(const grpc::Status& status, std::string_view rpc, const std::string& target) const {
  const grpc::StatusCode code = status.error_code();
  if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Status(
        static_cast<StatusCode>(code),
        fmt::format("cannot reach cohortd at {} ({}: {}); is cohortd running? start it with `cohortd "
                    "--role all --data-dir DIR`, or point --coordinator / COHORT_COORDINATOR at it",
                    target, rpc, status.error_message()));
  }
  return daemon::from_grpc_status(status, rpc, target);
}

StatusOr<cohort::v1::VersionInfo> Client::server_version() {
  grpc::ClientContext context;
  set_deadline(&context);
  cohort::v1::VersionInfo info;
  grpc::Status status = info_->GetVersion(&context, cohort::v1::GetVersionRequest(), &info);
  if (!status.ok()) return rpc_error(status, "Info.GetVersion", address_);
  return info;
}

StatusOr<std::string> Client::submit(const cohort::v1::JobSpec& spec) {
  cohort::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  cohort::v1::SubmitJobResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::Status status = coordinator_->SubmitJob(&context, request, &response);
  if (!status.ok()) return rpc_error(status, "Coordinator.SubmitJob", address_);
  return response.job_id();
}

StatusOr<cohort::v1::JobRecord> Client::get(const std::string& job_id) {
  cohort::v1::GetJobRequest request;
  request.set_job_id(job_id);
  cohort::v1::GetJobResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::Status status = coordinator_->GetJob(&context, request, &response);
  if (!status.ok()) return rpc_error(status, "Coordinator.GetJob", address_);
  return response.job();
}

StatusOr<std::vector<cohort::v1::JobRecord>> Client::list(const std::vector<cohort::v1::JobState>& states) {
  cohort::v1::ListJobsRequest request;
  for (cohort::v1::JobState state : states) request.add_states(state);
  cohort::v1::ListJobsResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::Status status = coordinator_->ListJobs(&context, request, &response);
  if (!status.ok()) return rpc_error(status, "Coordinator.ListJobs", address_);
  return std::vector<cohort::v1::JobRecord>(response.jobs().begin(), response.jobs().end());
}

StatusOr<cohort::v1::JobRecord> Client::cancel(const std::string& job_id, const std::string& reason) {
  cohort::v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  cohort::v1::CancelJobResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::Status status = coordinator_->CancelJob(&context, request, &response);
  if (!status.ok()) return rpc_error(status, "Coordinator.CancelJob", address_);
  return response.job();
}

StatusOr<std::vector<cohort::v1::NodeStatus>> Client::nodes() {
  cohort::v1::ListNodesResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::Status status = coordinator_->ListNodes(&context, cohort::v1::ListNodesRequest(), &response);
  if (!status.ok()) return rpc_error(status, "Coordinator.ListNodes", address_);
  return std::vector<cohort::v1::NodeStatus>(response.nodes().begin(), response.nodes().end());
}

Status Client::watch(const std::string& job_id, const JobEventCallback& on_event, int64_t after_seq,
                     StreamTimeout timeout) {
  cohort::v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_after_seq(after_seq);
  grpc::ClientContext context;
  if (timeout.has_value()) context.set_deadline(std::chrono::system_clock::now() + *timeout);
  std::unique_ptr<grpc::ClientReader<cohort::v1::JobEvent>> reader =
      coordinator_->WatchJob(&context, request);
  cohort::v1::JobEvent event;
  bool stopped = false;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      stopped = true;
      context.TryCancel();
      break;
    }
  }
  grpc::Status status = reader->Finish();
  if (stopped) return ok_status();
  if (!status.ok()) return rpc_error(status, "Coordinator.WatchJob", address_);
  return ok_status();
}

cohort::v1::Agent::Stub& Client::agent_stub(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<cohort::v1::Agent::Stub>& stub = agents_[address];
  if (stub == nullptr) {
    // The coordinator's own channel when the agent is the same daemon (`--role all`).
    stub = cohort::v1::Agent::NewStub(address == address_ ? channel_ : make_channel(address));
  }
  return *stub;
}

Status Client::logs(const std::string& job_id, int rank, bool follow, const LogCallback& on_data,
                    StreamTimeout timeout, const LogGapCallback& on_gap) {
  COHORT_ASSIGN_OR_RETURN(cohort::v1::JobRecord job, get(job_id));
  const cohort::v1::Placement& placement = job.placement();
  if (placement.nodes_size() == 0 && is_final(job.state())) {
    return failed_precondition_error("job {} ended ({}) without running, so it has no logs", job_id,
                                     cohort::v1::JobState_Name(job.state()));
  }
  if (placement.nodes_size() == 0) {
    return failed_precondition_error("job {} has not been placed yet ({}{}); its logs exist once it runs",
                                     job_id, cohort::v1::JobState_Name(job.state()),
                                     job.waiting_for().empty() ? "" : ": " + job.waiting_for());
  }
  const cohort::v1::NodeAssignment* node = nullptr;
  for (const cohort::v1::NodeAssignment& candidate : placement.nodes()) {
    if (rank >= candidate.first_rank() && rank < candidate.first_rank() + candidate.num_ranks())
      node = &candidate;
  }
  if (node == nullptr) {
    return invalid_argument_error("job {} has no rank {}; its ranks are 0..{}", job_id, rank,
                                  placement.world_size() - 1);
  }
  cohort::v1::StreamLogsRequest request;
  request.set_job_id(job_id);
  request.set_rank(rank);
  // A finished job's task has exited: follow only while there is something to wait for.
  request.set_follow(follow && !is_final(job.state()));
  request.set_stream(cohort::v1::BOTH);
  grpc::ClientContext context;
  if (timeout.has_value()) {
    context.set_deadline(std::chrono::system_clock::now() + *timeout);
  } else if (!request.follow()) {
    set_deadline(&context);
  }
  const std::string target = fmt::format("{} (node {})", node->address(), node->node_id());
  std::unique_ptr<grpc::ClientReader<cohort::v1::LogChunk>> reader =
      agent_stub(node->address()).StreamLogs(&context, request);
  cohort::v1::LogChunk chunk;
  bool stopped = false;
  int64_t expected_offset = 0;  // where the bytes received so far end
  while (reader->Read(&chunk)) {
    if (chunk.offset() > expected_offset && on_gap) {
      on_gap(chunk.offset() - expected_offset, chunk.log_path(), node->node_id());
    }
    expected_offset = chunk.offset() + static_cast<int64_t>(chunk.data().size());
    if (!on_data(chunk.data())) {
      stopped = true;
      context.TryCancel();
      break;
    }
  }
  grpc::Status status = reader->Finish();
  if (stopped) return ok_status();
  if (!status.ok()) return rpc_error(status, "Agent.StreamLogs", target);
  return ok_status();
}

}  // namespace cohort::client
