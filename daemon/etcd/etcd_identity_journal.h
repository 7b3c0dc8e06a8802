#pragma once

// EtcdIdentityJournal: the coordinators' identities in etcd (issue 16), so that whichever
// coordinator leads knows the users, join tokens and node certificates its predecessor knew, with
// no identity.db copied between them (daemon/coordinator/identity_journal.h says how the
// IdentityStore uses it). Keys, one protobuf message each (job_records.proto), under
// <prefix>/identity/:
//
//   users/<name>                  StoredUser (token hash, admin, revoked)
//   join_tokens/<secret sha256>   StoredJoinToken (expiry); deleted when a node uses it, or once
//                                 expired, when the leader issues the next token
//   certificates/<serial>         StoredNodeCertificate (node id, revoked)
//   seeded                        present once the first leader uploaded its identities
//
// Fencing, as every job store write (etcd_job_store.h): each write is one Txn that first compares
// the leader's election key, so a deposed coordinator writes nothing (FAILED_PRECONDITION).
// Consuming a join token also compares that its key still exists: of two coordinators that both
// hold the token (a leader that admitted a node just before it died, and its successor that
// loaded the token before that), only one deletes it, and one token admits one node.
//
// Cost: one Txn per identity change (a user added or revoked, a join token made or used, a node
// certificate issued, a node revoked), made by admin commands and joins, never per call (callers
// are authenticated from memory); load() reads the prefix page by page, once per leadership. Writes
// of more than kMaxOpsPerTxn keys (revoking a node with more certificates than that, pruning that
// many expired join tokens) are split into Txns of at most kMaxOpsPerTxn operations, each fenced
// on its own (etcd refuses a Txn over its --max-txn-ops, 128 by default), written in order.
//
// Thread-safe (EtcdClient is; the rest is immutable). Blocks on etcd round trips, bounded by the
// client's call timeout.

#include <optional>
#include <string>
#include <vector>

#include "daemon/coordinator/identity_journal.h"
#include "daemon/etcd/etcd_client.h"
#include "worker/base/status.h"

namespace cohort::etcd {

// Keys read per Range page in load() (a few hundred bytes each: a page stays far below gRPC's 4 MiB).
inline constexpr int64_t kIdentityLoadPageSize = 500;

class EtcdIdentityJournal final : public coordinator::IdentityJournal {
 public:
  // The identities of the coordinator cluster whose records are under `prefix` (the job store's,
  // no trailing '/'); `client` must outlive the journal; writes are fenced on `fence` when set.
  EtcdIdentityJournal(EtcdClient* client, std::string prefix, std::optional<LeaderKey> fence);

  StatusOr<std::optional<coordinator::IdentityRecords>> load() override;
  Status seed(const coordinator::IdentityRecords& records) override;
  Status put_user(const coordinator::UserRecord& user) override;
  Status put_join_token(const coordinator::JoinTokenRecord& token) override;
  // A consume with a fresh attempt id (below).
  Status consume_join_token(const std::string& secret_sha256) override;
  // One consume, named `attempt_id`: its Txn also writes used_join_token_key = attempt_id, so the
  // same request sent again after its reply was lost (EtcdClient::call's failover) is recognised as
  // done by this consume instead of refused as "used by another node". Public for tests.
  Status consume_join_token(const std::string& secret_sha256, const std::string& attempt_id);
  Status delete_join_tokens(const std::vector<std::string>& secret_sha256s) override;
  Status put_certificates(const std::vector<coordinator::CertificateRecord>& certificates) override;
  std::string description() const override;

  // Key helpers (tests read the layout).
  std::string identity_prefix() const { return prefix_ + "/identity/"; }
  std::string user_key(const std::string& name) const { return identity_prefix() + "users/" + name; }
  std::string join_token_key(const std::string& secret_sha256) const {
    return identity_prefix() + "join_tokens/" + secret_sha256;
  }
  std::string certificate_key(const std::string& serial) const {
    return identity_prefix() + "certificates/" + serial;
  }
  // Which consume took the token (consume_join_token); not read by load().
  std::string used_join_token_key(const std::string& secret_sha256) const {
    return identity_prefix() + "used_join_tokens/" + secret_sha256;
  }
  std::string seeded_key() const { return identity_prefix() + "seeded"; }

 private:
  // Runs `request` behind the fence. FAILED_PRECONDITION when a comparison fails.
  Status write(etcdserverpb::TxnRequest request, const std::string& what);
  // Runs `ops` in Txns of at most kMaxOpsPerTxn, in order, each behind the fence; stops at the
  // first that fails, saying how many keys were written before it. `what` names the change.
  Status write_batches(std::vector<etcdserverpb::RequestOp> ops, const std::string& what);

  EtcdClient* const client_;
  const std::string prefix_;
  const std::optional<LeaderKey> fence_;
};

}  // namespace cohort::etcd
