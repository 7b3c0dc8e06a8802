#include "daemon/service/coordinator_service.h"

#include <algorithm>
#include <charconv>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "daemon/coordinator/job_spec_validation.h"
#include "daemon/service/coordinator_proto.h"
#include "daemon/service/grpc_status.h"
#include "daemon/service/rpc_deadline.h"
#include "worker/base/tls.h"
#include "worker/graph/memory_estimate.h"
#include "worker/graph/shape_inference.h"

namespace cohort::daemon {
namespace {

using coordinator::AgentOrders;

Status require_job_id(const std::string& job_id) {
  if (job_id.empty()) return invalid_argument_error("job_id is empty; give the id SubmitJob returned");
  return ok_status();
}

Status require_node_id(const std::string& node_id) {
  if (node_id.empty())
    return invalid_argument_error("node_id is empty; give the id the node registered with");
  return ok_status();
}

// Whether every file path the spec names is absolute (or empty).
bool spec_paths_absolute(const cohort::v1::JobSpec& spec) {
  auto absolute = [](const std::string& path) { return path.empty() || path[0] == '/'; };
  if (!absolute(spec.dataset().path())) return false;
  if (spec.has_model_parallel()) {
    for (const cohort::v1::Stage& stage : spec.model_parallel().stages()) {
      if (stage.body_case() == cohort::v1::Stage::kTorchscriptFile && !absolute(stage.torchscript_file()))
        return false;
    }
  }
  return true;
}

// The ListJobs page token is the submission number of the page's last job, in decimal.
StatusOr<int64_t> parse_page_token(const std::string& token) {
  if (token.empty()) return int64_t{0};
  int64_t seq = 0;
  auto [end, error] = std::from_chars(token.data(), token.data() + token.size(), seq);
  if (error != std::errc() || end != token.data() + token.size() || seq < 0) {
    return invalid_argument_error(
        "page_token '{}' is not a token ListJobs returned; pass next_page_token as is", token);
  }
  return seq;
}

// Binds the call's authenticated caller (security::caller_of) or returns its error.
#define COHORT_GRPC_CALLER(var, context)                                  \
  StatusOr<security::Caller> var##_or = security::caller_of(*(context));  \
  if (!var##_or.ok()) return to_grpc_status(var##_or.status());            \
  const security::Caller& var = *var##_or

Status require_attempt(int attempt) {
  if (attempt < 1) return invalid_argument_error("attempt is {}; attempts are numbered from 1", attempt);
  return ok_status();
}

}  // namespace

CoordinatorService::CoordinatorService(coordinator::Coordinator* coordinator, const coordinator::Clock* clock,
                                       security::DaemonSecurity* security, OrdersHandler orders)
    : coordinator_(coordinator), clock_(clock), security_(security), orders_(std::move(orders)) {}

StatusOr<coordinator::Job> CoordinatorService::job_for(const security::Caller& caller,
                                                       const std::string& job_id) const {
  COHORT_RETURN_IF_ERROR(require_job_id(job_id));
  COHORT_ASSIGN_OR_RETURN(coordinator::Job job, coordinator_->get_job(job_id));
  COHORT_RETURN_IF_ERROR(security::require_job_access(caller, job_id, job.owner));
  return job;
}

void CoordinatorService::dispatch(AgentOrders orders) const {
  if (orders_ && !orders.empty()) orders_(std::move(orders));
}

grpc::Status CoordinatorService::RegisterNode(grpc::ServerContext* context,
                                              const cohort::v1::RegisterNodeRequest* request,
                                              cohort::v1::RegisterNodeResponse* response) {
  COHORT_GRPC_CALLER(caller, context);
  if (!request->has_node())
    return to_grpc_status(invalid_argument_error("node is not set; describe the node"));
  if (Status node = security::require_node(caller, request->node().node_id()); !node.ok())
    return to_grpc_status(node);
  // What the agent still runs, for reconciliation (fencing of what the coordinator no longer owns).
  std::vector<coordinator::RunningAttempt> running;
  for (const cohort::v1::RunningAttempt& attempt : request->running()) {
    if (Status id = require_job_id(attempt.job_id()); !id.ok()) return to_grpc_status(id);
    coordinator::RunningAttempt held{attempt.job_id(), attempt.attempt(),
                                     std::vector<int>(attempt.ranks().begin(), attempt.ranks().end())};
    // The exits it saw: taken by a coordinator that had not heard of them (it restarted since).
    for (const cohort::v1::ExitedRank& exited : attempt.exited()) {
      held.exited.push_back(coordinator::TaskExit{request->node().node_id(), attempt.job_id(), attempt.attempt(),
                                                  exited.rank(), exited.exit_code(), exited.signal(),
                                                  exited.detail()});
    }
    running.push_back(std::move(held));
  }
  AgentOrders unsent;
  StatusOr<AgentOrders> orders = coordinator_->register_node(from_proto(request->node()), running, &unsent);
  if (!orders.ok()) {
    // Orders decided before a store write failed (stops of an attempt whose failure was stored).
    dispatch(std::move(unsent));
    return to_grpc_status(orders.status());
  }
  dispatch(std::move(orders).value());
  const int64_t lease_ms = coordinator_->node_lease().count();
  response->set_lease_ms(lease_ms);
  response->set_heartbeat_interval_ms(lease_ms / kHeartbeatsPerLease);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* context,
                                           const cohort::v1::HeartbeatRequest* request,
                                           cohort::v1::HeartbeatResponse* response) {
  COHORT_GRPC_CALLER(caller, context);
  Status status = require_node_id(request->node_id());
  if (status.ok()) status = security::require_node(caller, request->node_id());
  if (status.ok() && !request->running_reported()) {
    // An older agent: what it runs is not known, so nothing is stopped.
    status = coordinator_->heartbeat(request->node_id(), request->unschedulable());
  } else if (status.ok()) {
    std::vector<coordinator::RunningAttempt> running;
    for (const cohort::v1::RunningAttempt& attempt : request->running()) {
      // One bad entry must not cost the node its lease renewal (and so, after a lease, its tasks):
      // it is left out of the judgment, which orders nothing for what the report leaves out.
      Status entry = require_job_id(attempt.job_id());
      if (!entry.ok()) {
        spdlog::warn("coordinator: node {}'s heartbeat reports attempt {} of a job whose id is not valid ({}); that "
                     "entry is ignored, the rest of the heartbeat is taken (an agent bug: report it)",
                     request->node_id(), attempt.attempt(), entry.to_string());
        continue;
      }
      running.push_back(coordinator::RunningAttempt{
          attempt.job_id(), attempt.attempt(), std::vector<int>(attempt.ranks().begin(), attempt.ranks().end())});
    }
    StatusOr<std::vector<coordinator::StopOrder>> stops =
        coordinator_->heartbeat(request->node_id(), request->unschedulable(), running);
    status = stops.status();
    // Judged on this coordinator's state; once another leads, that state may be behind its store.
    // A leader deposed without noticing yet passes this check: Coordinator::heartbeat orders only
    // stops that hold whoever leads, for that case.
    if (status.ok() && !stops->empty() && leading_ && !leading_()) {
      return to_grpc_status(unavailable_error(
          "this coordinator lost its leadership while node {}'s heartbeat ran; heartbeat the new leader",
          request->node_id()));
    }
    if (stops.ok()) {
      for (const coordinator::StopOrder& stop : *stops) {
        cohort::v1::HeartbeatStop* out = response->add_stops();
        out->set_job_id(stop.job_id);
        out->set_attempt(stop.attempt);
        out->set_reason(stop.reason);
      }
    }
  }
  if (!status.ok()) return to_grpc_status(status);
  response->set_lease_ms(coordinator_->node_lease().count());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* context,
                                           const cohort::v1::SubmitJobRequest* request,
                                           cohort::v1::SubmitJobResponse* response) {
  COHORT_GRPC_CALLER(caller, context);
  // Reject a bad spec at the edge, before anything is queued, with every problem in one message:
  // the structural checks and the layer / shape / dataset / wiring checks of the dry shape
  // inference (which leaves the stage-rank checks to validate_job_spec, so none is reported twice).
  const coordinator::JobSpecValidationOptions validation = coordinator_->validation_options();
  Status structural = coordinator::validate_job_spec(request->spec(), validation);
  graph::ModelValidationOptions model_options;
  model_options.check_stage_ranks = false;
  // The coordinator looks at the files a spec names only when they lie under the allowed roots (so
  // no answer tells whether a path outside them exists) and are absolute (a relative path lies in
  // the job's directory on the agent, not here).
  model_options.check_files = coordinator::validate_spec_paths(request->spec(), validation).ok() &&
                              spec_paths_absolute(request->spec());
  // A command job has no model: its program is its own.
  const bool command_job = request->spec().command_size() > 0;
  Status model = command_job ? ok_status() : graph::validate_model(request->spec(), model_options);
  if (!structural.ok() && !model.ok()) {
    return to_grpc_status(invalid_argument_error("{}; {}", structural.message(), model.message()));
  }
  if (!structural.ok()) return to_grpc_status(structural);
  if (!model.ok()) return to_grpc_status(model);
  // A job the cluster cannot hold is refused now rather than left PENDING forever.
  coordinator::CapacityRequest capacity;
  capacity.wait_for_capacity = request->wait_for_capacity();
  if (!command_job) {
    if (StatusOr<int64_t> bytes = graph::estimate_rank_memory_bytes(request->spec()); bytes.ok())
      capacity.estimated_bytes_per_rank = *bytes;
  }
  if (Status fits = coordinator_->check_capacity(request->spec(), capacity); !fits.ok())
    return to_grpc_status(fits);
  StatusOr<std::string> id = coordinator_->submit(request->spec(), caller.name);
  if (!id.ok()) return to_grpc_status(id.status());
  response->set_job_id(*id);
  // Place at once rather than at the next periodic tick, so a free cluster starts the job now.
  dispatch(coordinator_->tick());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* context,
                                        const cohort::v1::GetJobRequest* request,
                                        cohort::v1::GetJobResponse* response) {
  COHORT_GRPC_CALLER(caller, context);
  StatusOr<coordinator::Job> job = job_for(caller, request->job_id());
  if (!job.ok()) return to_grpc_status(job.status());
  to_proto(*job, response->mutable_job());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* context,
                                          const cohort::v1::ListJobsRequest* request,
                                          cohort::v1::ListJobsResponse* response) {
  COHORT_GRPC_CALLER(caller, context);
  if (request->all_users() && !caller.admin) {
    return to_grpc_status(permission_denied_error(
        "all_users (cohort list --all) is for admins; user {} sees their own jobs", caller.name));
  }
  // Everyone sees their own jobs; admins see everyone's only when they ask (--all).
  const bool everyone = request->all_users() && caller.admin;
  std::set<coordinator::JobState> wanted;
  for (int i = 0; i < request->states_size(); ++i) {
    StatusOr<coordinator::JobState> state = from_proto(request->states(i));
    if (!state.ok()) return to_grpc_status(state.status().with_context(fmt::format("states[{}]", i)));
    wanted.insert(*state);
  }
  // Pages: at most page_size jobs (0: kDefaultJobsPageSize; at most kMaxJobsPageSize), after the
  // job whose seq the token names.
  if (request->page_size() < 0) {
    return to_grpc_status(invalid_argument_error("page_size is {}; give 0 for the default ({}) or up to {}",
                                                 request->page_size(), coordinator::kDefaultJobsPageSize,
                                                 coordinator::kMaxJobsPageSize));
  }
  StatusOr<int64_t> after_seq = parse_page_token(request->page_token());
  if (!after_seq.ok()) return to_grpc_status(after_seq.status());
  const size_t page_size = request->page_size() == 0
                               ? coordinator::kDefaultJobsPageSize
                               : std::min<size_t>(request->page_size(), coordinator::kMaxJobsPageSize);
  coordinator::JobPage page = coordinator_->list_jobs_page(
      *after_seq, page_size,
      [&](const coordinator::Job& job) {
        return (everyone || job.owner == caller.name) && (wanted.empty() || wanted.count(job.state()) != 0);
      });
  for (const coordinator::Job& job : page.jobs) to_proto(job, response->add_jobs());
  if (page.next_after_seq != 0) response->set_next_page_token(std::to_string(page.next_after_seq));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* context,
                                           const cohort::v1::CancelJobRequest* request,
                                           cohort::v1::CancelJobResponse* response) {
  COHORT_GRPC_CALLER(caller, context);
  if (StatusOr<coordinator::Job> job = job_for(caller, request->job_id()); !job.ok())
    return to_grpc_status(job.status());
  const std::string reason = request->reason().empty() ? kDefaultCancelReason : request->reason();
  StatusOr<AgentOrders> orders = coordinator_->cancel(request->job_id(), reason);
  if (!orders.ok()) return to_grpc_status(orders.status());
  dispatch(std::move(orders).value());
  StatusOr<coordinator::Job> job = coordinator_->get_job(request->job_id());
  if (!job.ok()) return to_grpc_status(job.status());
  to_proto(*job, response->mutable_job());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* context,
                                          const cohort::v1::WatchJobRequest* request,
                                          grpc::ServerWriter<cohort::v1::JobEvent>* writer) {
  COHORT_GRPC_CALLER(caller, context);
  if (StatusOr<coordinator::Job> job = job_for(caller, request->job_id()); !job.ok())
    return to_grpc_status(job.status());
  int64_t after_seq = request->after_seq();
  while (true) {
    if (context->IsCancelled())
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the watch");
    // Read the state before draining: a job already final before this round has its final event
    // in what events() returns now, so an empty round then means the stream is complete.
    StatusOr<coordinator::Job> job = coordinator_->get_job(request->job_id());
    if (!job.ok()) return to_grpc_status(job.status());
    const bool was_final = coordinator::is_terminal(job->state());
    const Duration wait =
        was_final ? Duration(0) : std::min<Duration>(kWatchPollInterval, time_to_client_deadline(*context));
    StatusOr<std::vector<coordinator::JobEvent>> events =
        coordinator_->events(request->job_id(), after_seq, wait);
    if (!events.ok()) return to_grpc_status(events.status());
    bool reached_final = false;
    for (const coordinator::JobEvent& event : *events) {
      cohort::v1::JobEvent out;
      to_proto(event, &out);
      // A failed write means the client is gone; nobody is left to report to.
      if (!writer->Write(out)) return grpc::Status::OK;
      after_seq = event.seq;
      reached_final |= event.kind == coordinator::JobEvent::Kind::kStateChange &&
                       coordinator::is_terminal(event.change.to);
    }
    if (reached_final || (was_final && events->empty())) return grpc::Status::OK;
    if (time_to_client_deadline(*context) == Duration(0)) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the watch reached the client's deadline");
    }
  }
}

grpc::Status CoordinatorService::ListNodes(grpc::ServerContext* /*context*/,
                                           const cohort::v1::ListNodesRequest* /*request*/,
                                           cohort::v1::ListNodesResponse* response) {
  const coordinator::TimePoint now = clock_->now();
  for (const coordinator::NodeStatus& node : coordinator_->list_nodes())
    to_proto(node, now, response->add_nodes());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReportTaskExit(grpc::ServerContext* context,
                                                const cohort::v1::ReportTaskExitRequest* request,
                                                cohort::v1::ReportTaskExitResponse* /*response*/) {
  COHORT_GRPC_CALLER(caller, context);
  Status status = require_node_id(request->node_id());
  if (status.ok()) status = security::require_node(caller, request->node_id());
  if (status.ok()) status = require_job_id(request->job_id());
  if (status.ok()) status = require_attempt(request->attempt());
  if (!status.ok()) return to_grpc_status(status);
  coordinator::TaskExit exit;
  exit.node_id = request->node_id();
  exit.job_id = request->job_id();
  exit.attempt = request->attempt();
  exit.rank = request->rank();
  exit.exit_code = request->exit_code();
  exit.signal = request->signal();
  // Recorded as the job's reason: bounded, whatever a node sends.
  exit.detail = request->detail().substr(0, kMaxTaskExitDetailBytes);
  StatusOr<AgentOrders> orders = coordinator_->report_task_exit(exit);
  if (!orders.ok()) return to_grpc_status(orders.status());
  dispatch(std::move(orders).value());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReportTasksStarted(grpc::ServerContext* context,
                                                    const cohort::v1::ReportTasksStartedRequest* request,
                                                    cohort::v1::ReportTasksStartedResponse* /*response*/) {
  COHORT_GRPC_CALLER(caller, context);
  Status status = require_node_id(request->node_id());
  if (status.ok()) status = security::require_node(caller, request->node_id());
  if (status.ok()) status = require_job_id(request->job_id());
  if (status.ok()) status = require_attempt(request->attempt());
  if (status.ok())
    status = coordinator_->report_tasks_started(request->node_id(), request->job_id(), request->attempt());
  return to_grpc_status(status);
}

grpc::Status CoordinatorService::ReportMetrics(grpc::ServerContext* context,
                                               const cohort::v1::ReportMetricsRequest* request,
                                               cohort::v1::ReportMetricsResponse* /*response*/) {
  COHORT_GRPC_CALLER(caller, context);
  Status status = require_job_id(request->job_id());
  if (status.ok()) status = require_attempt(request->attempt());
  if (status.ok() && !security_->attempt_secret_valid(request->job_id(), request->attempt(), caller.secret)) {
    status = permission_denied_error("the job secret is not the one of job {} attempt {}", request->job_id(),
                                     request->attempt());
  }
  if (status.ok()) {
    status =
        coordinator_->report_metrics(request->job_id(), request->attempt(), from_proto(request->metrics()));
  }
  return to_grpc_status(status);
}

grpc::Status CoordinatorService::GetMetrics(grpc::ServerContext* context,
                                            const cohort::v1::GetMetricsRequest* request,
                                            cohort::v1::GetMetricsResponse* response) {
  COHORT_GRPC_CALLER(caller, context);
  if (StatusOr<coordinator::Job> job = job_for(caller, request->job_id()); !job.ok())
    return to_grpc_status(job.status());
  if (request->attempt() < 0 || request->after_seq() < 0) {
    return to_grpc_status(invalid_argument_error(
        "attempt {} / after_seq {}: both must be >= 0 (0: every attempt / from the oldest report)",
        request->attempt(), request->after_seq()));
  }
  StatusOr<std::vector<coordinator::MetricsRecord>> history =
      coordinator_->metrics_history(request->job_id(), request->after_seq(), request->attempt());
  if (!history.ok()) return to_grpc_status(history.status());
  for (const coordinator::MetricsRecord& record : *history) {
    cohort::v1::MetricsPoint* point = response->add_points();
    point->set_seq(record.seq);
    point->set_attempt(record.attempt);
    point->mutable_time()->set_seconds(record.unix_ms / 1000);
    point->mutable_time()->set_nanos(static_cast<int32_t>(record.unix_ms % 1000) * 1000000);
    to_proto(record.metrics, point->mutable_metrics());
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::StreamLogs(grpc::ServerContext* context, const cohort::v1::StreamLogsRequest* request,
                                            grpc::ServerWriter<cohort::v1::LogChunk>* writer) {
  COHORT_GRPC_CALLER(caller, context);
  StatusOr<coordinator::Job> job = job_for(caller, request->job_id());
  if (!job.ok()) return to_grpc_status(job.status());
  const coordinator::NodeAssignment* node = nullptr;
  for (const coordinator::NodeAssignment& candidate : job->placement.nodes) {
    if (request->rank() >= candidate.first_rank && request->rank() < candidate.first_rank + candidate.num_ranks)
      node = &candidate;
  }
  if (node == nullptr) {
    return to_grpc_status(failed_precondition_error(
        "job {} has no rank {} placed on any node (not placed yet, or the rank is out of range)", request->job_id(),
        request->rank()));
  }
  auto agent = cohort::v1::Agent::NewStub(tls::make_channel(node->address, security_->to_agent(node->node_id)));
  // The client's deadline and cancellation carry over to the agent call, so a client that leaves
  // a `logs -f` frees this thread and the agent's at once, not at the rank's next output.
  std::unique_ptr<grpc::ClientContext> agent_context = grpc::ClientContext::FromServerContext(*context);
  std::unique_ptr<grpc::ClientReader<cohort::v1::LogChunk>> reader = agent->StreamLogs(agent_context.get(), *request);
  cohort::v1::LogChunk chunk;
  while (reader->Read(&chunk)) {
    if (context->IsCancelled() || !writer->Write(chunk)) {
      agent_context->TryCancel();
      break;
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
    return grpc::Status(status.error_code(), fmt::format("Agent.StreamLogs to {} (node {}): {}", node->address,
                                                         node->node_id, status.error_message()));
  }
  return grpc::Status::OK;
}

}  // namespace cohort::daemon
