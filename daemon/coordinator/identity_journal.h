#pragma once

// IdentityJournal: where the leading coordinator's IdentityStore writes every identity change so
// that whichever coordinator leads next knows the same users, join tokens and node certificates
// (issue 16). A store several coordinators share (etcd, daemon/etcd/etcd_identity_journal.h) gives
// one; a single coordinator with SQLite has none, and its identity.db is the only record.
//
// The journal is the authority: IdentityStore::follow_journal() loads it (replacing what the local
// identity.db held, which stays as a cache of it so a restart without the journal still knows
// everyone), and each later change is written to it before the local cache and memory see it. A
// write the journal refuses (the coordinator was deposed: FAILED_PRECONDITION) changes nothing.
//
// Only hashes are written (a user's token and a join token's secret are shown once and never
// stored), as in identity.db.
//
// Thread-safe implementations; every method blocks on I/O, bounded by the journal's own timeouts.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/base/status.h"

namespace cohort::coordinator {

struct UserRecord {
  std::string name;
  std::string token_sha256;  // hex SHA-256 of the bearer token
  bool admin = false;
  bool revoked = false;
  int64_t create_unix_ms = 0;
};

struct JoinTokenRecord {
  std::string secret_sha256;  // hex SHA-256 of the secret
  int64_t expire_unix_ms = 0;
};

struct CertificateRecord {
  std::string serial;
  std::string node_id;
  bool revoked = false;
  // The certificate's notAfter (unix ms); 0 for a record made before it was kept (never expires
  // here: such a node must be revoked before it joins again).
  int64_t not_after_unix_ms = 0;
};

// Everything an IdentityStore holds.
struct IdentityRecords {
  std::vector<UserRecord> users;
  std::vector<JoinTokenRecord> join_tokens;  // unused ones (a consumed token is deleted)
  std::vector<CertificateRecord> certificates;
};

class IdentityJournal {
 public:
  virtual ~IdentityJournal() = default;

  // The records, or std::nullopt when the journal was never seeded (a new cluster: the first
  // leader uploads its local identities with seed()).
  virtual StatusOr<std::optional<IdentityRecords>> load() = 0;
  // Writes `records` and marks the journal seeded. FAILED_PRECONDITION (and nothing marked) when
  // another coordinator seeded it first or this one no longer leads.
  virtual Status seed(const IdentityRecords& records) = 0;
  // Writes a user's record (a new user, or one revoked).
  virtual Status put_user(const UserRecord& user) = 0;
  virtual Status put_join_token(const JoinTokenRecord& token) = 0;
  // Deletes the join token only if it is still there: one token admits one node, whichever
  // coordinator consumed it. PERMISSION_DENIED when it is gone (used already, or never seeded).
  virtual Status consume_join_token(const std::string& secret_sha256) = 0;
  // Deletes join tokens that expired (IdentityStore::prune_expired_join_tokens), whether or not
  // they are still there. A store may split a long list into several writes; on an error, some of
  // them may be gone already (harmless: an expired token admits no one, and the next prune deletes
  // the rest).
  virtual Status delete_join_tokens(const std::vector<std::string>& secret_sha256s) = 0;
  // Writes certificate records (a node's revocation revokes each of its certificates). A store may
  // split a long list into several writes, in order; on an error, the records of the writes before
  // it are written (a revocation half done errs on the side of revoked; run it again to finish it).
  virtual Status put_certificates(const std::vector<CertificateRecord>& certificates) = 0;
  // Names the journal in logs ("etcd://h:p/cohort/identity/").
  virtual std::string description() const = 0;
};

}  // namespace cohort::coordinator
