#include "daemon/service/coordinator_service.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "daemon/coordinator/job_spec_validation.h"
#include "daemon/service/coordinator_proto.h"
#include "daemon/service/grpc_status.h"
#include "daemon/service/rpc_deadline.h"
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

Status require_attempt(int attempt) {
  if (attempt < 1) return invalid_argument_error("attempt is {}; attempts are numbered from 1", attempt);
  return ok_status();
}

}  // namespace

CoordinatorService::CoordinatorService(coordinator::Coordinator* coordinator, const coordinator::Clock* clock,
                                       OrdersHandler orders)
    : coordinator_(coordinator), clock_(clock), orders_(std::move(orders)) {}

void CoordinatorService::dispatch(AgentOrders orders) const {
  if (orders_ && !orders.empty()) orders_(std::move(orders));
}

grpc::Status CoordinatorService::RegisterNode(grpc::ServerContext* /*context*/,
                                              const cohort::v1::RegisterNodeRequest* request,
                                              cohort::v1::RegisterNodeResponse* response) {
  if (!request->has_node())
    return to_grpc_status(invalid_argument_error("node is not set; describe the node"));
  StatusOr<AgentOrders> orders = coordinator_->register_node(from_proto(request->node()));
  if (!orders.ok()) return to_grpc_status(orders.status());
  dispatch(std::move(orders).value());
  const int64_t lease_ms = coordinator_->node_lease().count();
  response->set_lease_ms(lease_ms);
  response->set_heartbeat_interval_ms(lease_ms / kHeartbeatsPerLease);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* /*context*/,
                                           const cohort::v1::HeartbeatRequest* request,
                                           cohort::v1::HeartbeatResponse* response) {
  Status status = require_node_id(request->node_id());
  if (status.ok()) status = coordinator_->heartbeat(request->node_id(), request->unschedulable());
  if (!status.ok()) return to_grpc_status(status);
  response->set_lease_ms(coordinator_->node_lease().count());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* /*context*/,
                                           const cohort::v1::SubmitJobRequest* request,
                                           cohort::v1::SubmitJobResponse* response) {
  // Reject a bad spec at the edge, before anything is queued, with every problem in one message:
  // the structural checks and the layer / shape / dataset / wiring checks of the dry shape
  // inference (which leaves the stage-rank checks to validate_job_spec, so none is reported twice).
  Status structural = coordinator::validate_job_spec(request->spec());
  graph::ModelValidationOptions model_options;
  model_options.check_stage_ranks = false;
  Status model = graph::validate_model(request->spec(), model_options);
  if (!structural.ok() && !model.ok()) {
    return to_grpc_status(invalid_argument_error("{}; {}", structural.message(), model.message()));
  }
  if (!structural.ok()) return to_grpc_status(structural);
  if (!model.ok()) return to_grpc_status(model);
  StatusOr<std::string> id = coordinator_->submit(request->spec());
  if (!id.ok()) return to_grpc_status(id.status());
  response->set_job_id(*id);
  // Place at once rather than at the next periodic tick, so a free cluster starts the job now.
  dispatch(coordinator_->tick());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* /*context*/,
                                        const cohort::v1::GetJobRequest* request,
                                        cohort::v1::GetJobResponse* response) {
  if (Status status = require_job_id(request->job_id()); !status.ok()) return to_grpc_status(status);
  StatusOr<coordinator::Job> job = coordinator_->get_job(request->job_id());
  if (!job.ok()) return to_grpc_status(job.status());
  to_proto(*job, response->mutable_job());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* /*context*/,
                                          const cohort::v1::ListJobsRequest* request,
                                          cohort::v1::ListJobsResponse* response) {
  std::set<coordinator::JobState> wanted;
  for (int i = 0; i < request->states_size(); ++i) {
    StatusOr<coordinator::JobState> state = from_proto(request->states(i));
    if (!state.ok()) return to_grpc_status(state.status().with_context(fmt::format("states[{}]", i)));
    wanted.insert(*state);
  }
  for (const coordinator::Job& job : coordinator_->list_jobs()) {
    if (wanted.empty() || wanted.count(job.state()) != 0) to_proto(job, response->add_jobs());
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* /*context*/,
                                           const cohort::v1::CancelJobRequest* request,
                                           cohort::v1::CancelJobResponse* response) {
  if (Status status = require_job_id(request->job_id()); !status.ok()) return to_grpc_status(status);
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
  if (Status status = require_job_id(request->job_id()); !status.ok()) return to_grpc_status(status);
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

grpc::Status CoordinatorService::ReportTaskExit(grpc::ServerContext* /*context*/,
                                                const cohort::v1::ReportTaskExitRequest* request,
                                                cohort::v1::ReportTaskExitResponse* /*response*/) {
  Status status = require_node_id(request->node_id());
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
  StatusOr<AgentOrders> orders = coordinator_->report_task_exit(exit);
  if (!orders.ok()) return to_grpc_status(orders.status());
  dispatch(std::move(orders).value());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReportTasksStarted(grpc::ServerContext* /*context*/,
                                                    const cohort::v1::ReportTasksStartedRequest* request,
                                                    cohort::v1::ReportTasksStartedResponse* /*response*/) {
  Status status = require_node_id(request->node_id());
  if (status.ok()) status = require_job_id(request->job_id());
  if (status.ok()) status = require_attempt(request->attempt());
  if (status.ok())
    status = coordinator_->report_tasks_started(request->node_id(), request->job_id(), request->attempt());
  return to_grpc_status(status);
}

grpc::Status CoordinatorService::ReportMetrics(grpc::ServerContext* /*context*/,
                                               const cohort::v1::ReportMetricsRequest* request,
                                               cohort::v1::ReportMetricsResponse* /*response*/) {
  Status status = require_job_id(request->job_id());
  if (status.ok()) status = require_attempt(request->attempt());
  if (status.ok()) {
    status =
        coordinator_->report_metrics(request->job_id(), request->attempt(), from_proto(request->metrics()));
  }
  return to_grpc_status(status);
}

}  // namespace cohort::daemon
