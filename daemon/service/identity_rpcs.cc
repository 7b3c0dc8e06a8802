// CoordinatorService's user and node methods: AddUser, ListUsers, RevokeUser, CreateJoinToken,
// JoinCluster, RevokeNode, RenewNodeCertificate. Who may call them (admins; JoinCluster a join
// token; RenewNodeCertificate a node's certificate) is security::method_policy()'s, checked before
// these run.

#include <spdlog/spdlog.h>

#include "daemon/service/coordinator_service.h"
#include "daemon/service/grpc_status.h"

namespace cohort::daemon {
namespace {

google::protobuf::Timestamp timestamp_of(int64_t unix_ms) {
  google::protobuf::Timestamp out;
  out.set_seconds(unix_ms / 1000);
  out.set_nanos(static_cast<int32_t>((unix_ms % 1000) * 1000000));
  return out;
}

std::string caller_name(const grpc::ServerContext& context) {
  StatusOr<security::Caller> caller = security::caller_of(context);
  return caller.ok() ? caller->name : "?";
}

}  // namespace

grpc::Status CoordinatorService::AddUser(grpc::ServerContext* context, const cohort::v1::AddUserRequest* request,
                                         cohort::v1::AddUserResponse* response) {
  StatusOr<std::string> token = security_->identities()->add_user(request->name(), request->admin());
  if (!token.ok()) return to_grpc_status(token.status());
  spdlog::info("user {} added{} by {}", request->name(), request->admin() ? " as an admin" : "", caller_name(*context));
  response->set_credentials(security_->credentials_text(address_, *token));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListUsers(grpc::ServerContext* /*context*/,
                                           const cohort::v1::ListUsersRequest* /*request*/,
                                           cohort::v1::ListUsersResponse* response) {
  for (const coordinator::User& user : security_->identities()->list_users()) {
    cohort::v1::UserInfo* out = response->add_users();
    out->set_name(user.name);
    out->set_admin(user.admin);
    out->set_revoked(user.revoked);
    *out->mutable_create_time() = timestamp_of(user.create_unix_ms);
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::RevokeUser(grpc::ServerContext* context, const cohort::v1::RevokeUserRequest* request,
                                            cohort::v1::RevokeUserResponse* /*response*/) {
  if (request->name() == caller_name(*context)) {
    return to_grpc_status(failed_precondition_error(
        "you cannot revoke yourself ({}); another admin can", request->name()));
  }
  Status status = security_->identities()->revoke_user(request->name());
  if (status.ok()) spdlog::info("user {} revoked by {}", request->name(), caller_name(*context));
  return to_grpc_status(status);
}

grpc::Status CoordinatorService::CreateJoinToken(grpc::ServerContext* context,
                                                 const cohort::v1::CreateJoinTokenRequest* request,
                                                 cohort::v1::CreateJoinTokenResponse* response) {
  const int64_t now = clock_->unix_millis();
  StatusOr<std::string> secret =
      security_->identities()->add_join_token(std::chrono::milliseconds(request->ttl_ms()), now);
  if (!secret.ok()) return to_grpc_status(secret.status());
  response->set_token(security_->join_token_text(*secret));
  const int64_t ttl = request->ttl_ms() > 0 ? request->ttl_ms() : coordinator::kDefaultJoinTokenTtl.count();
  *response->mutable_expire_time() = timestamp_of(now + ttl);
  spdlog::info("join token created by {}", caller_name(*context));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::JoinCluster(grpc::ServerContext* context,
                                             const cohort::v1::JoinClusterRequest* request,
                                             cohort::v1::JoinClusterResponse* response) {
  // The token the Authenticator admitted (call metadata), not the request field's copy.
  StatusOr<security::Caller> caller = security::caller_of(*context);
  if (!caller.ok()) return to_grpc_status(caller.status());
  StatusOr<std::string> certificate = security_->sign_node(request->node_id(), request->csr_pem(), caller->secret);
  if (!certificate.ok()) return to_grpc_status(certificate.status());
  response->set_certificate_pem(*certificate);
  response->set_ca_certificate_pem(security_->ca_pem());
  spdlog::info("node {} joined the cluster", request->node_id());
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::RevokeNode(grpc::ServerContext* context, const cohort::v1::RevokeNodeRequest* request,
                                            cohort::v1::RevokeNodeResponse* /*response*/) {
  Status status = security_->identities()->revoke_node(request->node_id());
  if (!status.ok()) return to_grpc_status(status);
  spdlog::info("node {} revoked by {}", request->node_id(), caller_name(*context));
  // Untrusted from now on: dropped from the registry at once (its attempts fail over), not when its
  // lease would have run out.
  dispatch(coordinator_->remove_node(request->node_id(), "its certificate was revoked"));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::RenewNodeCertificate(grpc::ServerContext* context,
                                                      const cohort::v1::RenewNodeCertificateRequest* request,
                                                      cohort::v1::RenewNodeCertificateResponse* response) {
  // The node id is the one in the caller's verified certificate; the request's must match it.
  StatusOr<security::Caller> caller = security::caller_of(*context);
  if (!caller.ok()) return to_grpc_status(caller.status());
  if (Status same = security::require_node(*caller, request->node_id()); !same.ok()) return to_grpc_status(same);
  StatusOr<std::string> certificate = security_->renew_node(caller->name, request->csr_pem());
  if (!certificate.ok()) return to_grpc_status(certificate.status());
  response->set_certificate_pem(*certificate);
  response->set_ca_certificate_pem(security_->ca_pem());
  return grpc::Status::OK;
}

}  // namespace cohort::daemon
