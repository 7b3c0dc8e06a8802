#pragma once

// LeaderGate: whether this coordinator leads (issue 16, a highly available coordinator), and the
// gated cohort.v1.Coordinator and cohort.v1.Rendezvous services cohortd registers in front of the
// real ones. While this coordinator is a standby every call of both services answers UNAVAILABLE
// "cohortd at X is a standby coordinator; the leader is Y" with the trailing metadata
// `cohort-leader: Y` (empty when no leader is known), which worker/base/leader_channel.h follows.
// Once it leads, each call goes to the services lead() installed.
//
// A standby opens no Coordinator at all: the one that wins the election opens it then, loading
// every job from the shared store (a restarted coordinator's recovery), and installs it here.
// Installed services are never removed (calls in flight may use them); losing leadership closes
// the gate again, so new calls are refused at once.
//
//   LeaderGate gate("10.0.0.1:7070");                 // a standby until lead()
//   GatedCoordinatorService coordinator(&gate);       // registered with the gRPC server
//   gate.follow("10.0.0.2:7070");                     // the election names another leader
//   gate.lead(&real_coordinator, &real_rendezvous);   // this one won
//
// Thread-safe; lead() and follow() may race with calls.

#include <atomic>
#include <mutex>
#include <string>

#include <grpcpp/grpcpp.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "cohort/v1/rendezvous.grpc.pb.h"

namespace cohort::daemon {

class LeaderGate {
 public:
  // `self`: this coordinator's advertised HOST:PORT (for messages). Starts as a standby.
  explicit LeaderGate(std::string self) : self_(std::move(self)) {}

  // This coordinator leads: calls go to these services (not owned; they must outlive the gate).
  void lead(cohort::v1::Coordinator::Service* coordinator, cohort::v1::Rendezvous::Service* rendezvous);
  // This coordinator is a standby; `leader` is the leader's HOST:PORT, empty when unknown.
  void follow(const std::string& leader);
  void set_self(const std::string& self);

  bool leading() const { return leading_.load(std::memory_order_acquire); }
  // The leader's HOST:PORT: this coordinator's own when it leads; empty when unknown.
  std::string leader() const;
  // What a standby answers ("cohortd at X is a standby coordinator; the leader is Y"); "" while leading.
  std::string refusal() const;

  // The installed service while leading, else null and `*refusal` set to the standby answer
  // (with the cohort-leader trailer added to `context`).
  cohort::v1::Coordinator::Service* coordinator(grpc::ServerContext* context, grpc::Status* refusal) const;
  cohort::v1::Rendezvous::Service* rendezvous(grpc::ServerContext* context, grpc::Status* refusal) const;

 private:
  grpc::Status refuse(grpc::ServerContext* context) const;

  mutable std::mutex mu_;
  std::string self_;    // guarded by mu_
  std::string leader_;  // guarded by mu_; the other leader while a standby
  // Written before leading_ turns true (release), read after it is seen true (acquire).
  std::atomic<cohort::v1::Coordinator::Service*> coordinator_{nullptr};
  std::atomic<cohort::v1::Rendezvous::Service*> rendezvous_{nullptr};
  std::atomic<bool> leading_{false};
};

// cohort.v1.Coordinator in front of the real service: every method checks the gate first.
class GatedCoordinatorService final : public cohort::v1::Coordinator::Service {
 public:
  explicit GatedCoordinatorService(const LeaderGate* gate) : gate_(gate) {}

#define COHORT_GATED_UNARY(Method)                                                                    \
  grpc::Status Method(grpc::ServerContext* context, const cohort::v1::Method##Request* request,      \
                      cohort::v1::Method##Response* response) override {                              \
    grpc::Status refusal;                                                                             \
    cohort::v1::Coordinator::Service* service = gate_->coordinator(context, &refusal);                \
    return service == nullptr ? refusal : service->Method(context, request, response);                \
  }
  COHORT_GATED_UNARY(RegisterNode)
  COHORT_GATED_UNARY(Heartbeat)
  COHORT_GATED_UNARY(SubmitJob)
  COHORT_GATED_UNARY(GetJob)
  COHORT_GATED_UNARY(ListJobs)
  COHORT_GATED_UNARY(CancelJob)
  COHORT_GATED_UNARY(ListNodes)
  COHORT_GATED_UNARY(ReportTaskExit)
  COHORT_GATED_UNARY(ReportTasksStarted)
  COHORT_GATED_UNARY(ReportMetrics)
  COHORT_GATED_UNARY(GetMetrics)
  COHORT_GATED_UNARY(AddUser)
  COHORT_GATED_UNARY(ListUsers)
  COHORT_GATED_UNARY(RevokeUser)
  COHORT_GATED_UNARY(CreateJoinToken)
  COHORT_GATED_UNARY(JoinCluster)
  COHORT_GATED_UNARY(RevokeNode)
  COHORT_GATED_UNARY(RenewNodeCertificate)
#undef COHORT_GATED_UNARY

  grpc::Status WatchJob(grpc::ServerContext* context, const cohort::v1::WatchJobRequest* request,
                        grpc::ServerWriter<cohort::v1::JobEvent>* writer) override {
    grpc::Status refusal;
    cohort::v1::Coordinator::Service* service = gate_->coordinator(context, &refusal);
    return service == nullptr ? refusal : service->WatchJob(context, request, writer);
  }
  grpc::Status StreamLogs(grpc::ServerContext* context, const cohort::v1::StreamLogsRequest* request,
                          grpc::ServerWriter<cohort::v1::LogChunk>* writer) override {
    grpc::Status refusal;
    cohort::v1::Coordinator::Service* service = gate_->coordinator(context, &refusal);
    return service == nullptr ? refusal : service->StreamLogs(context, request, writer);
  }

 private:
  const LeaderGate* const gate_;
};

// cohort.v1.Rendezvous in front of the real service (worker ranks' cohort:// store).
class GatedRendezvousService final : public cohort::v1::Rendezvous::Service {
 public:
  explicit GatedRendezvousService(const LeaderGate* gate) : gate_(gate) {}

#define COHORT_GATED_UNARY(Method)                                                                    \
  grpc::Status Method(grpc::ServerContext* context, const cohort::v1::Method##Request* request,      \
                      cohort::v1::Method##Response* response) override {                              \
    grpc::Status refusal;                                                                             \
    cohort::v1::Rendezvous::Service* service = gate_->rendezvous(context, &refusal);                  \
    return service == nullptr ? refusal : service->Method(context, request, response);                \
  }
  COHORT_GATED_UNARY(Join)
  COHORT_GATED_UNARY(Set)
  COHORT_GATED_UNARY(Get)
  COHORT_GATED_UNARY(Add)
  COHORT_GATED_UNARY(CompareSet)
  COHORT_GATED_UNARY(Wait)
  COHORT_GATED_UNARY(Check)
  COHORT_GATED_UNARY(Delete)
  COHORT_GATED_UNARY(NumKeys)
  COHORT_GATED_UNARY(Barrier)
  COHORT_GATED_UNARY(Leave)
#undef COHORT_GATED_UNARY

 private:
  const LeaderGate* const gate_;
};

}  // namespace cohort::daemon
