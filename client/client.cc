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

namespace {

// `address` may list several coordinators (issue 16); the CLI checks the list's form
// (tls::parse_address_list) before it makes a Client, so a malformed one is kept whole here.
std::vector<std::string> coordinator_addresses(const std::string& address) {
  StatusOr<std::vector<std::string>> addresses = tls::parse_address_list(address);
  return addresses.ok() ? *addresses : std::vector<std::string>{address};
}

}  // namespace

Client::Client(const std::string& address, ClientOptions options)
    : address_(address),
      options_(options),
      // Keepalive pings even while a watch is silent for hours (tls::make_channel).
      leader_(std::make_unique<tls::LeaderChannel>(coordinator_addresses(address), options_.security)) {}

void Client::set_deadline(grpc::ClientContext* context) const {
  context->set_deadline(deadline());
}

std::chrono::system_clock::time_point Client::deadline() const {
  return std::chrono::system_clock::now() + options_.rpc_timeout;
}

Status Client::rpc_error(const grpc::Status& status, std::string_view rpc, const std::string& target) const {
  const grpc::StatusCode code = status.error_code();
  if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return Status(
        static_cast<StatusCode>(code),
        fmt::format("cannot reach cohortd at {} ({}: {}); is cohortd running? start it with `cohortd "
                    "--role all --data-dir DIR`, or point --coordinator / COHORT_COORDINATOR at it{}",
                    target, rpc, status.error_message(),
                    options_.security.insecure
                        ? ". This call went plaintext, which cohortd accepts only with insecure: true: pass "
                          "--credentials FILE or set COHORT_CREDENTIALS (the first admin's file is "
                          "DATA_DIR/admin.credentials on the coordinator)"
                        : ""));
  }
  return daemon::from_grpc_status(status, rpc, target);
}

StatusOr<cohort::v1::VersionInfo> Client::server_version() {
  cohort::v1::VersionInfo info;
  // Reads (GetVersion, GetJob, GetMetrics, ListJobs, ListNodes, ListUsers) are safe to send twice:
  // idempotent_unary leaves a coordinator that holds them without answering (a stopped or cut-off
  // leader whose connection stays up) after its share of the deadline, so a CLI given every
  // coordinator reaches the one that took over. Writes (SubmitJob, CancelJob, users, tokens, nodes)
  // may have taken effect at the hung one and wait out their deadline there (unary).
  grpc::Status status = leader_->idempotent_unary<cohort::v1::Info>(
      deadline(), &cohort::v1::Info::Stub::GetVersion, cohort::v1::GetVersionRequest(), &info);
  if (!status.ok()) return rpc_error(status, "Info.GetVersion", address_);
  return info;
}

StatusOr<std::string> Client::submit(const cohort::v1::JobSpec& spec, bool wait_for_capacity) {
  cohort::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  request.set_wait_for_capacity(wait_for_capacity);
  cohort::v1::SubmitJobResponse response;
  grpc::Status status = leader_->unary<cohort::v1::Coordinator>(deadline(), &cohort::v1::Coordinator::Stub::SubmitJob,
                                                                request, &response);
  if (!status.ok()) return rpc_error(status, "Coordinator.SubmitJob", address_);
  return response.job_id();
}

StatusOr<cohort::v1::JobRecord> Client::get(const std::string& job_id) {
  cohort::v1::GetJobRequest request;
  request.set_job_id(job_id);
  cohort::v1::GetJobResponse response;
  grpc::Status status = leader_->idempotent_unary<cohort::v1::Coordinator>(
      deadline(), &cohort::v1::Coordinator::Stub::GetJob, request, &response);
  if (!status.ok()) return rpc_error(status, "Coordinator.GetJob", address_);
  return response.job();
}

StatusOr<std::vector<cohort::v1::MetricsPoint>> Client::metrics(const std::string& job_id, int64_t after_seq,
                                                                 int attempt) {
  cohort::v1::GetMetricsRequest request;
  request.set_job_id(job_id);
  request.set_after_seq(after_seq);
  request.set_attempt(attempt);
  cohort::v1::GetMetricsResponse response;
  grpc::Status status = leader_->idempotent_unary<cohort::v1::Coordinator>(
      deadline(), &cohort::v1::Coordinator::Stub::GetMetrics, request, &response);
  if (!status.ok()) return rpc_error(status, "Coordinator.GetMetrics", address_);
  return std::vector<cohort::v1::MetricsPoint>(response.points().begin(), response.points().end());
}

StatusOr<std::vector<cohort::v1::JobRecord>> Client::list(const std::vector<cohort::v1::JobState>& states,
                                                          bool all_users) {
  cohort::v1::ListJobsRequest request;
  request.set_all_users(all_users);
  for (cohort::v1::JobState state : states) request.add_states(state);
  // The largest page the coordinator serves (kMaxJobsPageSize): fewest round trips.
  constexpr int kListPageSize = 1000;
  request.set_page_size(kListPageSize);
  std::vector<cohort::v1::JobRecord> jobs;
  while (true) {
    cohort::v1::ListJobsResponse response;
    grpc::Status status = leader_->idempotent_unary<cohort::v1::Coordinator>(
        deadline(), &cohort::v1::Coordinator::Stub::ListJobs, request, &response);
    if (!status.ok()) return rpc_error(status, "Coordinator.ListJobs", address_);
    jobs.insert(jobs.end(), response.jobs().begin(), response.jobs().end());
    // A token that does not move on would loop forever: stop at the first repeat.
    if (response.next_page_token().empty() || response.next_page_token() == request.page_token()) break;
    request.set_page_token(response.next_page_token());
  }
  return jobs;
}

StatusOr<cohort::v1::JobRecord> Client::cancel(const std::string& job_id, const std::string& reason) {
  cohort::v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  cohort::v1::CancelJobResponse response;
  grpc::Status status = leader_->unary<cohort::v1::Coordinator>(deadline(), &cohort::v1::Coordinator::Stub::CancelJob,
                                                                request, &response);
  if (!status.ok()) return rpc_error(status, "Coordinator.CancelJob", address_);
  return response.job();
}

StatusOr<std::vector<cohort::v1::NodeStatus>> Client::nodes() {
  cohort::v1::ListNodesResponse response;
  grpc::Status status = leader_->idempotent_unary<cohort::v1::Coordinator>(
      deadline(), &cohort::v1::Coordinator::Stub::ListNodes, cohort::v1::ListNodesRequest(), &response);
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
  // A stream is not sent again: it runs on the last known leader; a failed one moves the leader
  // on (note_result), so the caller's next watch goes to the right coordinator.
  const std::string leader = leader_->leader_address();
  auto coordinator = cohort::v1::Coordinator::NewStub(leader_->leader_channel());
  std::unique_ptr<grpc::ClientReader<cohort::v1::JobEvent>> reader = coordinator->WatchJob(&context, request);
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
  leader_->note_result(leader, context, status);
  if (!status.ok()) return rpc_error(status, "Coordinator.WatchJob", leader);
  return ok_status();
}

Status Client::logs(const std::string& job_id, int rank, bool follow, const LogCallback& on_data,
                    StreamTimeout timeout, const LogGapCallback& on_gap, const LogSelection& selection) {
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
  if (selection.attempt > job.attempt()) {
    return invalid_argument_error("job {} has no attempt {}; its attempts are 1..{}", job_id, selection.attempt,
                                  job.attempt());
  }
  cohort::v1::StreamLogsRequest request;
  request.set_job_id(job_id);
  request.set_rank(rank);
  // A finished job's task has exited: follow only while there is something to wait for.
  request.set_follow(follow && !is_final(job.state()));
  request.set_stream(cohort::v1::BOTH);
  request.set_attempt(selection.attempt);
  request.set_tail_lines(selection.tail_lines);
  request.set_since_unix_ms(selection.since_unix_ms);
  // Only the newest attempt has a task to follow.
  if (selection.attempt != 0 && selection.attempt != job.attempt()) request.set_follow(false);
  grpc::ClientContext context;
  if (timeout.has_value()) {
    context.set_deadline(std::chrono::system_clock::now() + *timeout);
  } else if (!request.follow()) {
    set_deadline(&context);
  }
  // Through the coordinator: agents take calls only from it, and it checks the job's owner.
  const std::string target = fmt::format("{} (rank {} on node {})", address_, rank, node->node_id());
  const std::string leader = leader_->leader_address();
  auto coordinator = cohort::v1::Coordinator::NewStub(leader_->leader_channel());
  std::unique_ptr<grpc::ClientReader<cohort::v1::LogChunk>> reader = coordinator->StreamLogs(&context, request);
  cohort::v1::LogChunk chunk;
  bool stopped = false;
  int64_t expected_offset = 0;  // where the bytes received so far end
  // A tail or a time cut starts where it starts: only bytes missing after that are a gap.
  bool first = selection.tail_lines > 0 || selection.since_unix_ms > 0;
  while (reader->Read(&chunk)) {
    if (first) expected_offset = chunk.offset();
    first = false;
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
  leader_->note_result(leader, context, status);
  if (!status.ok()) return rpc_error(status, "Coordinator.StreamLogs", target);
  return ok_status();
}

// One unary Coordinator call with the client's deadline through `send` (unary for a write,
// idempotent_unary for a read: see server_version); errors name the method.
#define COHORT_CLIENT_CALL_WITH(send, method, request, response)                          \
  do {                                                                                    \
    grpc::Status status = leader_->send<cohort::v1::Coordinator>(                         \
        deadline(), &cohort::v1::Coordinator::Stub::method, request, &response);          \
    if (!status.ok()) return rpc_error(status, "Coordinator." #method, address_);         \
  } while (0)
#define COHORT_CLIENT_CALL(method, request, response) COHORT_CLIENT_CALL_WITH(unary, method, request, response)
#define COHORT_CLIENT_READ(method, request, response) \
  COHORT_CLIENT_CALL_WITH(idempotent_unary, method, request, response)

StatusOr<std::string> Client::add_user(const std::string& name, bool admin) {
  cohort::v1::AddUserRequest request;
  request.set_name(name);
  request.set_admin(admin);
  cohort::v1::AddUserResponse response;
  COHORT_CLIENT_CALL(AddUser, request, response);
  return response.credentials();
}

StatusOr<std::vector<cohort::v1::UserInfo>> Client::list_users() {
  cohort::v1::ListUsersResponse response;
  COHORT_CLIENT_READ(ListUsers, cohort::v1::ListUsersRequest(), response);
  return std::vector<cohort::v1::UserInfo>(response.users().begin(), response.users().end());
}

Status Client::revoke_user(const std::string& name) {
  cohort::v1::RevokeUserRequest request;
  request.set_name(name);
  cohort::v1::RevokeUserResponse response;
  COHORT_CLIENT_CALL(RevokeUser, request, response);
  return ok_status();
}

StatusOr<cohort::v1::CreateJoinTokenResponse> Client::join_token(std::chrono::milliseconds ttl) {
  cohort::v1::CreateJoinTokenRequest request;
  request.set_ttl_ms(ttl.count());
  cohort::v1::CreateJoinTokenResponse response;
  COHORT_CLIENT_CALL(CreateJoinToken, request, response);
  return response;
}

Status Client::revoke_node(const std::string& node_id) {
  cohort::v1::RevokeNodeRequest request;
  request.set_node_id(node_id);
  cohort::v1::RevokeNodeResponse response;
  COHORT_CLIENT_CALL(RevokeNode, request, response);
  return ok_status();
}

}  // namespace cohort::client
