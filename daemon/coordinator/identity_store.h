#pragma once

// IdentityStore: who may talk to the coordinator. Users (a name, an admin flag and the SHA-256 of
// their bearer token: a token is shown once, when it is made, and never stored), join tokens (the
// SHA-256 of their secret and an expiry) and the certificates issued to nodes (serial, node id,
// revoked). Kept in SQLite beside the job records, in <data_dir>/identity.db (its own file: the job
// database holds an exclusive lock for its one connection), so a restarted coordinator knows
// everyone it knew.
//
//   COHORT_ASSIGN_OR_RETURN(auto store, IdentityStore::open(data_dir));
//   COHORT_ASSIGN_OR_RETURN(std::string token, store->add_user("alice", /*admin=*/false));
//   std::optional<User> who = store->user_by_token(token);   // what the server checks per call
//
// With a journal (follow_journal: the leader of coordinators that share an etcd store, issue 16),
// the journal is the authority: its records replace the local ones when this coordinator starts to
// lead, and each change is written to it first; identity.db stays a cache of it.
//
// Thread-safe: changes are serialized (one at a time, journal write included); lookups on the
// per-call path are answered from memory under a second mutex that no journal or disk I/O holds
// long (the Authenticator runs them on gRPC's threads and must not block).

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/coordinator/identity_journal.h"
#include "daemon/coordinator/sqlite_db.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

// Bytes of randomness in a user token and a join token's secret (hex-encoded: twice as many chars).
inline constexpr size_t kTokenBytes = 32;
// How long a join token admits nodes unless its maker says otherwise.
inline constexpr std::chrono::milliseconds kDefaultJoinTokenTtl = std::chrono::hours(24);
// The longest a join token may live.
inline constexpr std::chrono::milliseconds kMaxJoinTokenTtl = std::chrono::hours(24 * 30);

struct User {
  std::string name;
  bool admin = false;
  bool revoked = false;
  int64_t create_unix_ms = 0;
};

// Whether `name` is a valid user name: [a-z_][a-z0-9_-]{0,31} (a Unix user name's shape, so a
// user_map entry can use the same name).
Status validate_user_name(const std::string& name);
// Whether `node_id` is a valid node id: a lower-case host name, [a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?
// without "..". Lower case only, because certificate names match case-insensitively: "NODE-A"
// must not pass for "node-a".
Status validate_node_id(const std::string& node_id);

class IdentityStore {
 public:
  static constexpr const char* kDatabaseFile = "identity.db";
  // Opens (creating the tables if missing) <data_dir>/identity.db.
  static StatusOr<std::unique_ptr<IdentityStore>> open(const std::string& data_dir);

  // Adds a user and returns their new token. ALREADY_EXISTS when the name is taken (revoked
  // names stay taken: their jobs keep their owner).
  StatusOr<std::string> add_user(const std::string& name, bool admin);
  // Every user in name order.
  std::vector<User> list_users() const;
  // Stops accepting the user's token. NOT_FOUND naming the user.
  Status revoke_user(const std::string& name);
  // The live (not revoked) user holding `token`, if any. Constant-time in the token's content.
  std::optional<User> user_by_token(const std::string& token) const;
  // Whether any admin exists (the first start creates one).
  bool has_admin() const;

  // A new join token secret valid until now + ttl. Prunes the tokens expired by `now_unix_ms`
  // first (prune_expired_join_tokens), so unused tokens do not pile up in identity.db and the
  // journal: an error of that prune is returned, and no token is made.
  StatusOr<std::string> add_join_token(std::chrono::milliseconds ttl, int64_t now_unix_ms);
  // Deletes every join token expired at `now_unix_ms` (it admits no one any more), from the journal
  // first, then here; returns how many. An error changes nothing here (the journal may have
  // deleted some: harmless, they were expired). Blocks on the journal's I/O.
  StatusOr<size_t> prune_expired_join_tokens(int64_t now_unix_ms);
  // Whether `secret` is a join token valid at `now_unix_ms`.
  bool join_token_valid(const std::string& secret, int64_t now_unix_ms) const;
  // Uses up a join token (one node joins per token). PERMISSION_DENIED when it is not valid (any
  // more).
  Status consume_join_token(const std::string& secret, int64_t now_unix_ms);

  // Records a certificate issued to `node_id`, valid until `not_after_unix_ms` (0: unknown).
  Status add_node_certificate(const std::string& serial, const std::string& node_id, int64_t not_after_unix_ms = 0);
  // Revokes every certificate issued to `node_id`. NOT_FOUND when none was.
  Status revoke_node(const std::string& node_id);
  // Whether the certificate with `serial` was issued to `node_id` and is not revoked. Unknown
  // serials are not valid: only certificates this coordinator recorded are accepted.
  bool certificate_valid(const std::string& serial, const std::string& node_id) const;
  // Whether `node_id` holds a certificate that is not revoked and not expired at `now_unix_ms` (a
  // second join for it is refused; a node whose certificate expired may join again with a new
  // token). A record without an expiry (made before it was kept) counts as valid.
  bool node_has_valid_certificate(const std::string& node_id, int64_t now_unix_ms) const;

  // What follow_journal found.
  struct JournalSync {
    bool seeded = false;  // the journal was empty: this store's records were uploaded to it
    size_t users = 0;     // what the store holds now
    size_t join_tokens = 0;
    size_t certificates = 0;
  };
  // Makes `journal` the authority for every identity (a coordinator starting to lead): loads its
  // records, replacing this store's memory and identity.db with them; or, when the journal was
  // never seeded (a new cluster's first leader), uploads this store's records to it. Every later
  // change is written to the journal before it lands here. On error nothing changes here and no
  // journal is followed. Blocks on the journal's I/O.
  StatusOr<JournalSync> follow_journal(std::shared_ptr<IdentityJournal> journal);
  // Everything the store holds (what seeding uploads; tests).
  IdentityRecords records() const;

 private:
  explicit IdentityStore(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}
  Status load();
  // Replaces the tables and the maps with `records`, in one SQLite transaction. Requires mu_.
  Status replace_locked(const IdentityRecords& records);
  void clear_maps_locked();
  void apply_locked(const IdentityRecords& records);
  // prune_expired_join_tokens's work. Requires write_mu_ (not mu_).
  StatusOr<size_t> prune_expired_join_tokens_locked(int64_t now_unix_ms);

  // Serializes changes, the journal's round trip included; taken before mu_. Lookups never take it.
  std::mutex write_mu_;
  std::shared_ptr<IdentityJournal> journal_;  // set under write_mu_ and mu_; null: identity.db only
  mutable std::mutex mu_;                     // the database and the maps below
  std::unique_ptr<SqliteDb> db_;
  std::map<std::string, User> users_;                  // by name
  std::map<std::string, std::string> token_hashes_;    // SHA-256 hex -> user name
  std::map<std::string, std::string> user_hashes_;     // user name -> SHA-256 hex of their token
  std::map<std::string, int64_t> join_tokens_;         // SHA-256 hex -> expiry (unix ms)
  struct NodeCertificate {
    std::string node_id;
    bool revoked = false;
    int64_t not_after_unix_ms = 0;  // 0: unknown
  };
  std::map<std::string, NodeCertificate> certificates_;  // by serial
};

}  // namespace cohort::coordinator
