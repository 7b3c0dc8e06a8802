#pragma once

// Authenticator: who may call what, for every gRPC method cohortd serves (STYLE rule 15). One
// table, method_policy(), declares each method's caller; one gRPC AuthMetadataProcessor checks it
// for every call before any handler runs, and records who the caller is on the call's
// AuthContext, where handlers read it with caller_of() for the checks that need the request
// (the job's owner, the node a report names, the attempt a job secret belongs to).
//
// Callers prove who they are with:
//   - a user's bearer token ("authorization: Bearer ..."), checked against the IdentityStore;
//   - a node certificate (mutual TLS, signed by the cluster CA, CN = node id, not revoked);
//   - the coordinator's certificate (CN = "cohort-coordinator"), for the agents' methods;
//   - a worker rank's job secret (x-cohort-job-secret), checked by the handler against its attempt;
//   - a join token (x-cohort-join-token), for JoinCluster only.
// No credentials at all: UNAUTHENTICATED. Credentials of the wrong kind, or a user who is not an
// admin calling an admin method: PERMISSION_DENIED. Each message says which, and what to do.

#include <functional>
#include <map>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include "daemon/coordinator/identity_store.h"
#include "worker/base/status.h"

namespace cohort::security {

enum class Access {
  kPublic,       // anyone who completed the TLS handshake (health checks)
  kAnyIdentity,  // any valid user, node or the coordinator (version queries)
  kUser,         // any user's token; the handler checks the job's owner
  kAdmin,        // an admin's token
  kNode,         // a node certificate; the handler checks it is the node the request names
  kCoordinator,  // the coordinator's certificate (what an agent obeys)
  kJobSecret,    // a worker rank's job secret; the handler checks it against the attempt
  kJoinToken,    // a valid join token
};

// "/cohort.v1.Coordinator/SubmitJob" -> who may call it, for every method of every service cohortd
// serves. A method not listed is refused (PERMISSION_DENIED), so a new method cannot slip through.
const std::map<std::string, Access>& method_policy();

// Who is calling, as the Authenticator established it.
struct Caller {
  enum class Kind { kUser, kNode, kCoordinator, kJobSecret, kJoinToken, kPublic };
  Kind kind = Kind::kPublic;
  std::string name;    // user name (kUser) or node id (kNode)
  bool admin = false;  // kUser: an admin; also true for every caller of a plaintext development daemon
  std::string secret;  // kJobSecret, kJoinToken: the secret presented
  bool plaintext = false;  // a plaintext development daemon (insecure: true): no identities at all
};

struct AuthenticatorOptions {
  // Users, join tokens and revoked node certificates; null on an agent-only daemon (whose only
  // legitimate caller is the coordinator).
  const coordinator::IdentityStore* identities = nullptr;
  // A standby coordinator's refusal (issue 16): "" while this daemon leads (or is no coordinator),
  // else the text its LeaderGate answers with. A standby may not know the users, join tokens or
  // nodes added since it was seeded; a call of cohort.v1.Coordinator or Rendezvous whose credentials
  // it cannot verify then gets UNAVAILABLE with this text (so the client tries the next
  // coordinator) instead of UNAUTHENTICATED. Empty function: never a standby.
  std::function<std::string()> standby_refusal;
};

class Authenticator final : public grpc::AuthMetadataProcessor {
 public:
  explicit Authenticator(AuthenticatorOptions options) : options_(options) {}
  // Cheap and non-blocking (a hash and a map lookup): runs on gRPC's own thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata, OutputMetadata* response_metadata) override;

 private:
  // Who is calling and whether the method allows it; the caller's properties added to `context`.
  grpc::Status check(const InputMetadata& auth_metadata, grpc::AuthContext* context);

  const AuthenticatorOptions options_;
};

// The caller of this call. On a TLS server every call that reaches a handler has one; a
// plaintext development daemon (insecure: true, loopback only) treats every caller as a local
// admin. UNAUTHENTICATED when neither holds (a handler on a TLS port without the Authenticator).
StatusOr<Caller> caller_of(const grpc::ServerContext& context);

// Checks that `caller` may act on a job owned by `owner`: its owner or an admin.
Status require_job_access(const Caller& caller, const std::string& job_id, const std::string& owner);
// Checks that `caller` is the node `node_id` (its certificate's CN).
Status require_node(const Caller& caller, const std::string& node_id);

}  // namespace cohort::security
