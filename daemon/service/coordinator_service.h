#pragma once

// gRPC adapter for cohort.v1.Coordinator over coordinator::Coordinator. Each RPC validates its
// request at the edge, calls the coordinator, and converts the answer; the coordinator's Status
// becomes the call's status through to_grpc_status. Orders for agents that a call produces (launch,
// stop) go to the OrdersHandler the daemon supplies.
//
//   CoordinatorService service(coordinator.get(), &clock, [&](AgentOrders o) { agents.send(o); });
//   builder.RegisterService(&service);
//
// Thread-safe (the coordinator is); handlers block only in WatchJob, in slices of at most
// kWatchPollInterval so a departed client or a server shutdown ends the stream promptly.

#include <chrono>
#include <functional>
#include <utility>

#include "cohort/v1/agent.grpc.pb.h"
#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/coordinator.h"
#include "daemon/security/authenticator.h"
#include "daemon/security/daemon_security.h"

namespace cohort::daemon {

// Receives what agents must do; called on gRPC handler threads and the tick thread, concurrently.
using OrdersHandler = std::function<void(coordinator::AgentOrders orders)>;

// How long WatchJob waits for an event before checking that its client is still there.
inline constexpr std::chrono::milliseconds kWatchPollInterval = std::chrono::seconds(1);
// Agents heartbeat this many times per lease, so one lost heartbeat never loses the node.
inline constexpr int kHeartbeatsPerLease = 3;
// The longest ReportTaskExit detail kept (it becomes a job's reason); longer ones are cut.
inline constexpr size_t kMaxTaskExitDetailBytes = 1024;
// The reason CancelJob records when the request gives none.
inline constexpr const char* kDefaultCancelReason = "cancelled by a client";

class CoordinatorService final : public cohort::v1::Coordinator::Service {
 public:
  // `coordinator`, `clock` and `security` are not owned and must outlive the service; `orders` may
  // be empty (orders are then dropped). Who may call each method is security::method_policy()'s;
  // the handlers add the checks that need the request: a job's owner, the node a report names, the
  // attempt a job secret belongs to.
  CoordinatorService(coordinator::Coordinator* coordinator, const coordinator::Clock* clock,
                     security::DaemonSecurity* security, OrdersHandler orders);

  grpc::Status RegisterNode(grpc::ServerContext* context, const cohort::v1::RegisterNodeRequest* request,
                            cohort::v1::RegisterNodeResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const cohort::v1::HeartbeatRequest* request,
                         cohort::v1::HeartbeatResponse* response) override;
  grpc::Status SubmitJob(grpc::ServerContext* context, const cohort::v1::SubmitJobRequest* request,
                         cohort::v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const cohort::v1::GetJobRequest* request,
                      cohort::v1::GetJobResponse* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const cohort::v1::ListJobsRequest* request,
                        cohort::v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const cohort::v1::CancelJobRequest* request,
                         cohort::v1::CancelJobResponse* response) override;
  // Streams the job's events after request->after_seq until the job reaches a final state (the
  // stream then ends OK), the client cancels, or the server shuts down (UNAVAILABLE).
  grpc::Status WatchJob(grpc::ServerContext* context, const cohort::v1::WatchJobRequest* request,
                        grpc::ServerWriter<cohort::v1::JobEvent>* writer) override;
  grpc::Status ListNodes(grpc::ServerContext* context, const cohort::v1::ListNodesRequest* request,
                         cohort::v1::ListNodesResponse* response) override;
  grpc::Status ReportTaskExit(grpc::ServerContext* context, const cohort::v1::ReportTaskExitRequest* request,
                              cohort::v1::ReportTaskExitResponse* response) override;
  grpc::Status ReportTasksStarted(grpc::ServerContext* context,
                                  const cohort::v1::ReportTasksStartedRequest* request,
                                  cohort::v1::ReportTasksStartedResponse* response) override;
  grpc::Status ReportMetrics(grpc::ServerContext* context, const cohort::v1::ReportMetricsRequest* request,
                             cohort::v1::ReportMetricsResponse* response) override;
  grpc::Status GetMetrics(grpc::ServerContext* context, const cohort::v1::GetMetricsRequest* request,
                          cohort::v1::GetMetricsResponse* response) override;
  // Forwards Agent.StreamLogs from the node the rank ran on (agents take calls only from here).
  grpc::Status StreamLogs(grpc::ServerContext* context, const cohort::v1::StreamLogsRequest* request,
                          grpc::ServerWriter<cohort::v1::LogChunk>* writer) override;

  // The address new credentials files name (the server's, once bound). Call before serving.
  void set_address(const std::string& address) { address_ = address; }
  // Whether this coordinator leads now (HA: LeaderGate::leading); unset, it always does. A heartbeat
  // during which it lost its leadership gets no stops (UNAVAILABLE instead): its successor owns the
  // node's tasks now. Call before serving.
  void set_leading(std::function<bool()> leading) { leading_ = std::move(leading); }

  // Users and nodes (identity_rpcs.cc).
  grpc::Status AddUser(grpc::ServerContext* context, const cohort::v1::AddUserRequest* request,
                       cohort::v1::AddUserResponse* response) override;
  grpc::Status ListUsers(grpc::ServerContext* context, const cohort::v1::ListUsersRequest* request,
                         cohort::v1::ListUsersResponse* response) override;
  grpc::Status RevokeUser(grpc::ServerContext* context, const cohort::v1::RevokeUserRequest* request,
                          cohort::v1::RevokeUserResponse* response) override;
  grpc::Status CreateJoinToken(grpc::ServerContext* context, const cohort::v1::CreateJoinTokenRequest* request,
                               cohort::v1::CreateJoinTokenResponse* response) override;
  grpc::Status JoinCluster(grpc::ServerContext* context, const cohort::v1::JoinClusterRequest* request,
                           cohort::v1::JoinClusterResponse* response) override;
  grpc::Status RevokeNode(grpc::ServerContext* context, const cohort::v1::RevokeNodeRequest* request,
                          cohort::v1::RevokeNodeResponse* response) override;
  grpc::Status RenewNodeCertificate(grpc::ServerContext* context, const cohort::v1::RenewNodeCertificateRequest* request,
                                    cohort::v1::RenewNodeCertificateResponse* response) override;

 private:
  void dispatch(coordinator::AgentOrders orders) const;
  // The job, if `caller` may act on it (its owner or an admin).
  StatusOr<coordinator::Job> job_for(const security::Caller& caller, const std::string& job_id) const;

  coordinator::Coordinator* const coordinator_;
  const coordinator::Clock* const clock_;
  security::DaemonSecurity* const security_;
  std::string address_;
  const OrdersHandler orders_;
  std::function<bool()> leading_;  // set before serving, then only read
};

}  // namespace cohort::daemon
