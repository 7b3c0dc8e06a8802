#pragma once

// gRPC adapter for cohort.v1.Rendezvous over the coordinator's per-attempt Rendezvous and its
// KvStore: the server side of the `cohort://host:port/<job>` init method. Each RPC validates the
// attempt reference, finds the attempt's rendezvous, and calls it outside the coordinator's lock.
//
// Blocking calls (Join, Get, Wait, Barrier) wait for the request's timeout_ms (0: the
// coordinator's default), never longer than the client's deadline, so a handler never outlives
// its call; when the attempt ends every waiter returns its reason at once.
//
// Thread-safe; `coordinator` is not owned and must outlive the service.

#include <memory>

#include "cohort/v1/rendezvous.grpc.pb.h"
#include "daemon/coordinator/coordinator.h"
#include "daemon/security/daemon_security.h"

namespace cohort::daemon {

class RendezvousService final : public cohort::v1::Rendezvous::Service {
 public:
  // Neither is owned; both must outlive the service. Every call must carry its attempt's secret.
  RendezvousService(coordinator::Coordinator* coordinator, const security::DaemonSecurity* security)
      : coordinator_(coordinator), security_(security) {}

  grpc::Status Join(grpc::ServerContext* context, const cohort::v1::JoinRequest* request,
                    cohort::v1::JoinResponse* response) override;
  grpc::Status Set(grpc::ServerContext* context, const cohort::v1::SetRequest* request,
                   cohort::v1::SetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const cohort::v1::GetRequest* request,
                   cohort::v1::GetResponse* response) override;
  grpc::Status Add(grpc::ServerContext* context, const cohort::v1::AddRequest* request,
                   cohort::v1::AddResponse* response) override;
  grpc::Status CompareSet(grpc::ServerContext* context, const cohort::v1::CompareSetRequest* request,
                          cohort::v1::CompareSetResponse* response) override;
  grpc::Status Wait(grpc::ServerContext* context, const cohort::v1::WaitRequest* request,
                    cohort::v1::WaitResponse* response) override;
  grpc::Status Check(grpc::ServerContext* context, const cohort::v1::CheckRequest* request,
                     cohort::v1::CheckResponse* response) override;
  grpc::Status Delete(grpc::ServerContext* context, const cohort::v1::DeleteRequest* request,
                      cohort::v1::DeleteResponse* response) override;
  grpc::Status NumKeys(grpc::ServerContext* context, const cohort::v1::NumKeysRequest* request,
                       cohort::v1::NumKeysResponse* response) override;
  grpc::Status Barrier(grpc::ServerContext* context, const cohort::v1::BarrierRequest* request,
                       cohort::v1::BarrierResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const cohort::v1::LeaveRequest* request,
                     cohort::v1::LeaveResponse* response) override;

 private:
  // The rendezvous `ref` names. INVALID_ARGUMENT for an empty job id or attempt < 1; the
  // coordinator's NOT_FOUND / FAILED_PRECONDITION otherwise.
  StatusOr<std::shared_ptr<coordinator::Rendezvous>> find(const grpc::ServerContext& context,
                                                          const cohort::v1::AttemptRef& ref) const;

  coordinator::Coordinator* const coordinator_;
  const security::DaemonSecurity* const security_;
};

}  // namespace cohort::daemon
