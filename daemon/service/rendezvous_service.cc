#include "daemon/service/rendezvous_service.h"

#include <optional>
#include <string>
#include <vector>

#include "daemon/service/grpc_status.h"
#include "daemon/service/rpc_deadline.h"
#include "daemon/security/authenticator.h"

namespace cohort::daemon {
namespace {

using coordinator::Rendezvous;

std::vector<std::string> keys_of(const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

Status require_key(const std::string& key) {
  if (key.empty()) return invalid_argument_error("key is empty; store keys must name something");
  return ok_status();
}

// Returns the call's gRPC status from a StatusOr expression, or binds its value.
#define COHORT_GRPC_ASSIGN_OR_RETURN(lhs, expr) \
  COHORT_GRPC_ASSIGN_OR_RETURN_IMPL(COHORT_STATUS_CONCAT(grpc_statusor_, __LINE__), lhs, expr)
#define COHORT_GRPC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                      \
  if (!tmp.ok()) return to_grpc_status(tmp.status());     \
  lhs = std::move(tmp).value()

#define COHORT_GRPC_RETURN_IF_ERROR(expr)                        \
  do {                                                           \
    ::cohort::Status grpc_status_ = (expr);                      \
    if (!grpc_status_.ok()) return to_grpc_status(grpc_status_); \
  } while (0)

}  // namespace

StatusOr<std::shared_ptr<Rendezvous>> RendezvousService::find(const grpc::ServerContext& context,
                                                               const cohort::v1::AttemptRef& ref) const {
  if (ref.job_id().empty())
    return invalid_argument_error("attempt.job_id is empty; give the job the worker runs for");
  if (ref.attempt() < 1) {
    return invalid_argument_error("attempt.attempt is {} for job {}; attempts are numbered from 1",
                                  ref.attempt(), ref.job_id());
  }
  // Only the attempt's own ranks hold its secret (the agent hands it to them), so no other job,
  // user or host can join, read or rewrite this attempt's store.
  COHORT_ASSIGN_OR_RETURN(security::Caller caller, security::caller_of(context));
  if (!security_->attempt_secret_valid(ref.job_id(), ref.attempt(), caller.secret)) {
    return permission_denied_error("the job secret is not the one of job {} attempt {}; only that attempt's ranks "
                                   "(COHORT_JOB_SECRET, set by the agent) may use its rendezvous",
                                   ref.job_id(), ref.attempt());
  }
  return coordinator_->rendezvous(ref.job_id(), ref.attempt());
}

grpc::Status RendezvousService::Join(grpc::ServerContext* context, const cohort::v1::JoinRequest* request,
                                     cohort::v1::JoinResponse* response) {
  if (request->node_id().empty()) {
    return to_grpc_status(invalid_argument_error("node_id is empty; give the node the worker runs on"));
  }
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  COHORT_GRPC_ASSIGN_OR_RETURN(
      Duration wait, bounded_wait(*context, request->timeout_ms(), coordinator::kDefaultRendezvousTimeout));
  COHORT_GRPC_ASSIGN_OR_RETURN(coordinator::RankAssignment assignment,
                               rendezvous->join(request->node_id(), request->local_slot(), wait));
  response->set_rank(assignment.rank);
  response->set_world_size(assignment.world_size);
  response->set_local_rank(assignment.local_rank);
  response->set_local_world_size(assignment.local_world_size);
  response->set_node_rank(assignment.node_rank);
  response->set_num_nodes(assignment.num_nodes);
  response->set_master_address(assignment.master_address);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Set(grpc::ServerContext* context, const cohort::v1::SetRequest* request,
                                    cohort::v1::SetResponse* /*response*/) {
  COHORT_GRPC_RETURN_IF_ERROR(require_key(request->key()));
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  return to_grpc_status(rendezvous->store().set(request->key(), request->value()));
}

grpc::Status RendezvousService::Get(grpc::ServerContext* context, const cohort::v1::GetRequest* request,
                                    cohort::v1::GetResponse* response) {
  COHORT_GRPC_RETURN_IF_ERROR(require_key(request->key()));
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  COHORT_GRPC_ASSIGN_OR_RETURN(
      Duration wait, bounded_wait(*context, request->timeout_ms(), coordinator::kDefaultStoreTimeout));
  COHORT_GRPC_ASSIGN_OR_RETURN(std::string value, rendezvous->store().get(request->key(), wait));
  response->set_value(std::move(value));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Add(grpc::ServerContext* context, const cohort::v1::AddRequest* request,
                                    cohort::v1::AddResponse* response) {
  COHORT_GRPC_RETURN_IF_ERROR(require_key(request->key()));
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  COHORT_GRPC_ASSIGN_OR_RETURN(
      int64_t value, rendezvous->store().add(request->key(), request->delta(), request->request_id()));
  response->set_value(value);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::CompareSet(grpc::ServerContext* context,
                                           const cohort::v1::CompareSetRequest* request,
                                           cohort::v1::CompareSetResponse* response) {
  COHORT_GRPC_RETURN_IF_ERROR(require_key(request->key()));
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  COHORT_GRPC_ASSIGN_OR_RETURN(
      std::string value,
      rendezvous->store().compare_set(request->key(), request->expected(), request->desired()));
  response->set_value(std::move(value));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Wait(grpc::ServerContext* context, const cohort::v1::WaitRequest* request,
                                     cohort::v1::WaitResponse* /*response*/) {
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  COHORT_GRPC_ASSIGN_OR_RETURN(
      Duration wait, bounded_wait(*context, request->timeout_ms(), coordinator::kDefaultStoreTimeout));
  return to_grpc_status(rendezvous->store().wait(keys_of(request->keys()), wait));
}

grpc::Status RendezvousService::Check(grpc::ServerContext* context,
                                      const cohort::v1::CheckRequest* request,
                                      cohort::v1::CheckResponse* response) {
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  COHORT_GRPC_ASSIGN_OR_RETURN(bool all_set, rendezvous->store().check(keys_of(request->keys())));
  response->set_all_set(all_set);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Delete(grpc::ServerContext* context,
                                       const cohort::v1::DeleteRequest* request,
                                       cohort::v1::DeleteResponse* response) {
  COHORT_GRPC_RETURN_IF_ERROR(require_key(request->key()));
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  COHORT_GRPC_ASSIGN_OR_RETURN(bool existed,
                               rendezvous->store().delete_key(request->key(), request->request_id()));
  response->set_existed(existed);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::NumKeys(grpc::ServerContext* context,
                                        const cohort::v1::NumKeysRequest* request,
                                        cohort::v1::NumKeysResponse* response) {
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  COHORT_GRPC_ASSIGN_OR_RETURN(int64_t num_keys, rendezvous->store().num_keys());
  response->set_num_keys(num_keys);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Barrier(grpc::ServerContext* context,
                                        const cohort::v1::BarrierRequest* request,
                                        cohort::v1::BarrierResponse* /*response*/) {
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  COHORT_GRPC_ASSIGN_OR_RETURN(
      Duration wait, bounded_wait(*context, request->timeout_ms(), coordinator::kDefaultRendezvousTimeout));
  const std::optional<int64_t> generation =
      request->has_generation() ? std::optional<int64_t>(request->generation()) : std::nullopt;
  return to_grpc_status(rendezvous->barrier(request->rank(), wait, generation));
}

grpc::Status RendezvousService::Leave(grpc::ServerContext* context,
                                      const cohort::v1::LeaveRequest* request,
                                      cohort::v1::LeaveResponse* /*response*/) {
  COHORT_GRPC_ASSIGN_OR_RETURN(auto rendezvous, find(*context, request->attempt()));
  return to_grpc_status(rendezvous->leave(request->rank()));
}

#undef COHORT_GRPC_ASSIGN_OR_RETURN
#undef COHORT_GRPC_ASSIGN_OR_RETURN_IMPL
#undef COHORT_GRPC_RETURN_IF_ERROR

}  // namespace cohort::daemon
