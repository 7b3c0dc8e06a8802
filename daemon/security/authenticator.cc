#include "daemon/security/authenticator.h"

#include <fmt/format.h>

#include "daemon/security/cluster_ca.h"
#include "worker/base/tls.h"

namespace cohort::security {
namespace {

// Properties the Authenticator adds to a call's AuthContext.
constexpr const char* kKindProperty = "cohort.caller_kind";
// The services a standby coordinator refuses (issue 16).
constexpr const char* kCoordinatorPrefix = "/cohort.v1.Coordinator/";
constexpr const char* kRendezvousPrefix = "/cohort.v1.Rendezvous/";
constexpr const char* kNameProperty = "cohort.caller_name";
constexpr const char* kAdminProperty = "cohort.caller_admin";
constexpr const char* kSecretProperty = "cohort.caller_secret";

constexpr const char* kNoCredentials =
    "{} needs credentials: the call carried no token, certificate or job secret. Pass --credentials FILE "
    "or set COHORT_CREDENTIALS (an admin makes a credentials file with `cohort user add NAME`)";

const char* kind_name(Caller::Kind kind) {
  switch (kind) {
    case Caller::Kind::kUser: return "user";
    case Caller::Kind::kNode: return "node";
    case Caller::Kind::kCoordinator: return "coordinator";
    case Caller::Kind::kJobSecret: return "job";
    case Caller::Kind::kJoinToken: return "join";
    case Caller::Kind::kPublic: return "public";
  }
  return "public";
}

std::string first_value(const grpc::AuthMetadataProcessor::InputMetadata& metadata, const std::string& key) {
  auto it = metadata.find(key);
  return it == metadata.end() ? "" : std::string(it->second.data(), it->second.size());
}

std::string property(const grpc::AuthContext& context, const char* name) {
  std::vector<grpc::string_ref> values = context.FindPropertyValues(name);
  return values.empty() ? "" : std::string(values.front().data(), values.front().size());
}

grpc::Status unauthenticated(const std::string& message) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, message);
}
grpc::Status permission_denied(const std::string& message) {
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, message);
}

const char* access_text(Access access) {
  switch (access) {
    case Access::kPublic: return "anyone";
    case Access::kAnyIdentity: return "users, nodes and the coordinator";
    case Access::kUser: return "users";
    case Access::kAdmin: return "admins";
    case Access::kNode: return "nodes (their agent's certificate)";
    case Access::kCoordinator: return "the coordinator";
    case Access::kJobSecret: return "a job's ranks (its attempt secret)";
    case Access::kJoinToken: return "joining nodes (a join token)";
  }
  return "nobody";
}

}  // namespace

const std::map<std::string, Access>& method_policy() {
  static const std::map<std::string, Access> kPolicy = {
      // cohort.v1.Coordinator
      {"/cohort.v1.Coordinator/RegisterNode", Access::kNode},
      {"/cohort.v1.Coordinator/Heartbeat", Access::kNode},
      {"/cohort.v1.Coordinator/SubmitJob", Access::kUser},
      {"/cohort.v1.Coordinator/GetJob", Access::kUser},
      {"/cohort.v1.Coordinator/GetMetrics", Access::kUser},
      {"/cohort.v1.Coordinator/ListJobs", Access::kUser},
      {"/cohort.v1.Coordinator/CancelJob", Access::kUser},
      {"/cohort.v1.Coordinator/WatchJob", Access::kUser},
      {"/cohort.v1.Coordinator/StreamLogs", Access::kUser},
      {"/cohort.v1.Coordinator/ListNodes", Access::kUser},
      {"/cohort.v1.Coordinator/ReportTaskExit", Access::kNode},
      {"/cohort.v1.Coordinator/ReportTasksStarted", Access::kNode},
      {"/cohort.v1.Coordinator/ReportMetrics", Access::kJobSecret},
      {"/cohort.v1.Coordinator/AddUser", Access::kAdmin},
      {"/cohort.v1.Coordinator/ListUsers", Access::kAdmin},
      {"/cohort.v1.Coordinator/RevokeUser", Access::kAdmin},
      {"/cohort.v1.Coordinator/CreateJoinToken", Access::kAdmin},
      {"/cohort.v1.Coordinator/JoinCluster", Access::kJoinToken},
      {"/cohort.v1.Coordinator/RevokeNode", Access::kAdmin},
      // Signed for the node id of the caller's certificate (require_node), never the CSR's subject.
      {"/cohort.v1.Coordinator/RenewNodeCertificate", Access::kNode},
      // cohort.v1.Rendezvous: a job's ranks only, each call checked against its attempt.
      {"/cohort.v1.Rendezvous/Join", Access::kJobSecret},
      {"/cohort.v1.Rendezvous/Set", Access::kJobSecret},
      {"/cohort.v1.Rendezvous/Get", Access::kJobSecret},
      {"/cohort.v1.Rendezvous/Add", Access::kJobSecret},
      {"/cohort.v1.Rendezvous/CompareSet", Access::kJobSecret},
      {"/cohort.v1.Rendezvous/Wait", Access::kJobSecret},
      {"/cohort.v1.Rendezvous/Check", Access::kJobSecret},
      {"/cohort.v1.Rendezvous/Delete", Access::kJobSecret},
      {"/cohort.v1.Rendezvous/NumKeys", Access::kJobSecret},
      {"/cohort.v1.Rendezvous/Barrier", Access::kJobSecret},
      {"/cohort.v1.Rendezvous/Leave", Access::kJobSecret},
      // cohort.v1.Agent: an agent takes orders only from the coordinator.
      {"/cohort.v1.Agent/LaunchTasks", Access::kCoordinator},
      {"/cohort.v1.Agent/StopTasks", Access::kCoordinator},
      {"/cohort.v1.Agent/StreamLogs", Access::kCoordinator},
      {"/cohort.v1.Agent/NodeInfo", Access::kCoordinator},
      // cohort.v1.Info
      {"/cohort.v1.Info/GetVersion", Access::kAnyIdentity},
      // Health probes (load balancers, systemd) carry no identity; they learn only SERVING or not.
      {"/grpc.health.v1.Health/Check", Access::kPublic},
      {"/grpc.health.v1.Health/Watch", Access::kPublic},
      // Server reflection (grpcurl, grpc_cli): the schema of the services above, which any
      // authenticated caller may read (it is in the installed .proto files too); not anonymous.
      {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", Access::kAnyIdentity},
  };
  return kPolicy;
}

grpc::Status Authenticator::Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                                    OutputMetadata* /*consumed_auth_metadata*/,
                                    OutputMetadata* /*response_metadata*/) {
  grpc::Status status = check(auth_metadata, context);
  if (status.ok() || !options_.standby_refusal) return status;
  const std::string method = first_value(auth_metadata, ":path");
  if (method.rfind(kCoordinatorPrefix, 0) != 0 && method.rfind(kRendezvousPrefix, 0) != 0) return status;
  // A standby that cannot verify the caller sends it on rather than refusing who it may not know.
  const std::string refusal = options_.standby_refusal();
  return refusal.empty() ? status : grpc::Status(grpc::StatusCode::UNAVAILABLE, refusal);
}

grpc::Status Authenticator::check(const InputMetadata& auth_metadata, grpc::AuthContext* context) {
  const std::string method = first_value(auth_metadata, ":path");
  auto entry = method_policy().find(method);
  if (entry == method_policy().end())
    return permission_denied(fmt::format("{} is not a method cohortd serves to anyone", method));
  const Access access = entry->second;

  // Establish who is calling, from the strongest credential present.
  Caller caller;
  bool has_credentials = false;
  std::string refusal;  // why presented credentials did not authenticate
  const std::string authorization = first_value(auth_metadata, "authorization");
  const std::string peer_cn = property(*context, "x509_common_name");
  if (!authorization.empty()) {
    has_credentials = true;
    constexpr std::string_view kBearer = "Bearer ";
    std::optional<coordinator::User> user;
    if (options_.identities != nullptr && authorization.compare(0, kBearer.size(), kBearer) == 0)
      user = options_.identities->user_by_token(authorization.substr(kBearer.size()));
    if (user) {
      caller.kind = Caller::Kind::kUser;
      caller.name = user->name;
      caller.admin = user->admin;
    } else if (options_.identities == nullptr) {
      refusal = "this daemon is an agent: it takes orders only from the coordinator, not from users";
    } else {
      refusal = "the token is not valid (unknown, or revoked); ask an admin for a new credentials file "
                "(`cohort user add NAME`)";
    }
  } else if (!peer_cn.empty()) {
    has_credentials = true;
    if (peer_cn == tls::kCoordinatorName) {
      caller.kind = Caller::Kind::kCoordinator;
    } else {
      // On the coordinator: only certificates it recorded for that node id, and not revoked
      // (fails closed: a certificate that does not parse is refused too). An agent-only daemon
      // keeps no record; the TLS layer verified the CA, and no agent method is for nodes anyway.
      StatusOr<CertificateInfo> info = certificate_info(property(*context, "x509_pem_cert"));
      if (options_.identities != nullptr &&
          (!info.ok() || !options_.identities->certificate_valid(info->serial, peer_cn))) {
        refusal = fmt::format("the certificate of node {} is not valid here (revoked with `cohort node revoke`, or "
                              "not issued by this coordinator); the node must join again with a new join token",
                              peer_cn);
      } else {
        caller.kind = Caller::Kind::kNode;
        caller.name = peer_cn;
      }
    }
  } else if (std::string secret = first_value(auth_metadata, tls::kJobSecretMetadata); !secret.empty()) {
    has_credentials = true;
    caller.kind = Caller::Kind::kJobSecret;
    caller.secret = secret;
  } else if (std::string join = first_value(auth_metadata, tls::kJoinTokenMetadata); !join.empty()) {
    has_credentials = true;
    // Checked here and used up by JoinCluster itself (one node per token).
    if (options_.identities != nullptr &&
        options_.identities->join_token_valid(
            join, std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count())) {
      caller.kind = Caller::Kind::kJoinToken;
      caller.secret = join;
    } else {
      refusal = "the join token is not valid (unknown or expired); an admin makes a new one with "
                "`cohort node token`";
    }
  }

  if (access == Access::kPublic) {
    caller = Caller{};
  } else {
    if (!has_credentials) return unauthenticated(fmt::format(kNoCredentials, method));
    if (!refusal.empty()) return unauthenticated(fmt::format("{}: {}", method, refusal));
    const bool allowed =
        (access == Access::kAnyIdentity &&
         (caller.kind == Caller::Kind::kUser || caller.kind == Caller::Kind::kNode ||
          caller.kind == Caller::Kind::kCoordinator)) ||
        (access == Access::kUser && caller.kind == Caller::Kind::kUser) ||
        (access == Access::kAdmin && caller.kind == Caller::Kind::kUser && caller.admin) ||
        (access == Access::kNode && caller.kind == Caller::Kind::kNode) ||
        (access == Access::kCoordinator && caller.kind == Caller::Kind::kCoordinator) ||
        (access == Access::kJobSecret && caller.kind == Caller::Kind::kJobSecret) ||
        (access == Access::kJoinToken && caller.kind == Caller::Kind::kJoinToken);
    if (!allowed) {
      const std::string who = caller.kind == Caller::Kind::kUser
                                  ? fmt::format("user {}{}", caller.name, caller.admin ? " (admin)" : "")
                                  : caller.kind == Caller::Kind::kNode ? fmt::format("node {}", caller.name)
                                                                        : std::string(kind_name(caller.kind));
      return permission_denied(fmt::format("{} is for {} only; the caller is {}", method, access_text(access), who));
    }
  }
  context->AddProperty(kKindProperty, kind_name(caller.kind));
  context->AddProperty(kNameProperty, caller.name);
  context->AddProperty(kAdminProperty, caller.admin ? "1" : "0");
  context->AddProperty(kSecretProperty, caller.secret);
  return grpc::Status::OK;
}

StatusOr<Caller> caller_of(const grpc::ServerContext& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return unauthenticated_error("the call has no security context");
  const std::string kind = property(*auth, kKindProperty);
  if (kind.empty()) {
    // "ssl": grpc::SslServerCredentials; "tls": TlsServerCredentials (an agent's port, which
    // reloads a renewed node certificate).
    const std::string transport = property(*auth, GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
    if (transport != "ssl" && transport != "tls") {
      // Plaintext: only a daemon started with `insecure: true` on loopback listens like this.
      Caller local;
      local.kind = Caller::Kind::kUser;
      local.name = "local";
      local.admin = true;
      local.plaintext = true;
      return local;
    }
    return unauthenticated_error("the call was not authenticated");
  }
  Caller caller;
  for (Caller::Kind k : {Caller::Kind::kUser, Caller::Kind::kNode, Caller::Kind::kCoordinator,
                         Caller::Kind::kJobSecret, Caller::Kind::kJoinToken, Caller::Kind::kPublic}) {
    if (kind == kind_name(k)) caller.kind = k;
  }
  caller.name = property(*auth, kNameProperty);
  caller.admin = property(*auth, kAdminProperty) == "1";
  caller.secret = property(*auth, kSecretProperty);
  return caller;
}

Status require_job_access(const Caller& caller, const std::string& job_id, const std::string& owner) {
  if (caller.admin || (caller.kind == Caller::Kind::kUser && caller.name == owner)) return ok_status();
  return permission_denied_error("job {} belongs to {}; only its owner or an admin may act on it (you are {})",
                                 job_id, owner.empty() ? "nobody" : owner,
                                 caller.name.empty() ? kind_name(caller.kind) : caller.name);
}

Status require_node(const Caller& caller, const std::string& node_id) {
  if (caller.kind == Caller::Kind::kNode && caller.name == node_id) return ok_status();
  if (caller.plaintext) return ok_status();  // a plaintext development daemon has no node identities
  return permission_denied_error("the certificate of node {} cannot act for node {}",
                                 caller.name.empty() ? kind_name(caller.kind) : caller.name, node_id);
}

}  // namespace cohort::security
