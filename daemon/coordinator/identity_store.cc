#include "daemon/coordinator/identity_store.h"

#include <regex>
#include <utility>

#include "worker/base/crypto.h"
#include "worker/base/tls.h"

namespace cohort::coordinator {
namespace {

constexpr const char* kSchema = R"sql(
  CREATE TABLE IF NOT EXISTS users (
    name           TEXT PRIMARY KEY,
    token_sha256   TEXT NOT NULL UNIQUE,   -- hex SHA-256 of the bearer token
    admin          INTEGER NOT NULL,
    revoked        INTEGER NOT NULL,
    create_unix_ms INTEGER NOT NULL
  );
  CREATE TABLE IF NOT EXISTS join_tokens (
    secret_sha256  TEXT PRIMARY KEY,
    expire_unix_ms INTEGER NOT NULL
  );
  CREATE TABLE IF NOT EXISTS node_certificates (
    serial  TEXT PRIMARY KEY,
    node_id TEXT NOT NULL,
    revoked INTEGER NOT NULL,
    not_after_unix_ms INTEGER NOT NULL DEFAULT 0   -- 0: recorded before expiries were kept
  );
)sql";

// identity.db files made before node_certificates had not_after_unix_ms get the column (0: unknown).
Status add_not_after_column(SqliteDb* db) {
  COHORT_ASSIGN_OR_RETURN(SqliteStatement columns, db->prepare("PRAGMA table_info(node_certificates)"));
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, columns.step());
    if (!row) break;
    if (columns.column_text(1) == "not_after_unix_ms") return ok_status();
  }
  return db->exec("ALTER TABLE node_certificates ADD COLUMN not_after_unix_ms INTEGER NOT NULL DEFAULT 0");
}

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Status validate_user_name(const std::string& name) {
  static const std::regex kPattern("[a-z_][a-z0-9_-]{0,31}");
  if (!std::regex_match(name, kPattern)) {
    return invalid_argument_error(
        "user name {:?} is not valid: use 1-32 characters, lowercase letters, digits, '_' or '-', not starting "
        "with a digit or '-'",
        name);
  }
  return ok_status();
}

Status validate_node_id(const std::string& node_id) {
  static const std::regex kPattern("[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?");
  if (!std::regex_match(node_id, kPattern) || node_id.find("..") != std::string::npos ||
      node_id == tls::kCoordinatorName) {
    return invalid_argument_error(
        "node id {:?} is not valid: use a lower-case host name (1-63 lower-case letters, digits, '.' or '-', "
        "starting and ending with a letter or digit), not {:?}",
        node_id, tls::kCoordinatorName);
  }
  return ok_status();
}

StatusOr<std::unique_ptr<IdentityStore>> IdentityStore::open(const std::string& data_dir) {
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<SqliteDb> db, SqliteDb::open(data_dir + "/" + kDatabaseFile));
  // As the job store: one coordinator per data directory, every write durable before it is answered.
  COHORT_SQLITE_CHECK(db->handle(), sqlite3_busy_timeout(db->handle(), 1000));
  COHORT_RETURN_IF_ERROR(db->exec("PRAGMA locking_mode = EXCLUSIVE"));
  COHORT_RETURN_IF_ERROR(db->exec("PRAGMA journal_mode = WAL"));
  COHORT_RETURN_IF_ERROR(db->exec("PRAGMA synchronous = FULL"));
  COHORT_RETURN_IF_ERROR(db->exec(kSchema));
  COHORT_RETURN_IF_ERROR(add_not_after_column(db.get()));
  std::unique_ptr<IdentityStore> store(new IdentityStore(std::move(db)));
  COHORT_RETURN_IF_ERROR(store->load());
  return store;
}

Status IdentityStore::load() {
  IdentityRecords records;
  COHORT_ASSIGN_OR_RETURN(SqliteStatement users,
                          db_->prepare("SELECT name, token_sha256, admin, revoked, create_unix_ms FROM users"));
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, users.step());
    if (!row) break;
    records.users.push_back(UserRecord{users.column_text(0), users.column_text(1), users.column_int64(2) != 0,
                                       users.column_int64(3) != 0, users.column_int64(4)});
  }
  COHORT_ASSIGN_OR_RETURN(SqliteStatement tokens, db_->prepare("SELECT secret_sha256, expire_unix_ms FROM join_tokens"));
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, tokens.step());
    if (!row) break;
    records.join_tokens.push_back(JoinTokenRecord{tokens.column_text(0), tokens.column_int64(1)});
  }
  COHORT_ASSIGN_OR_RETURN(SqliteStatement certs,
                          db_->prepare("SELECT serial, node_id, revoked, not_after_unix_ms FROM node_certificates"));
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, certs.step());
    if (!row) break;
    records.certificates.push_back(CertificateRecord{certs.column_text(0), certs.column_text(1),
                                                     certs.column_int64(2) != 0, certs.column_int64(3)});
  }
  apply_locked(records);
  return ok_status();
}

void IdentityStore::clear_maps_locked() {
  users_.clear();
  token_hashes_.clear();
  user_hashes_.clear();
  join_tokens_.clear();
  certificates_.clear();
}

void IdentityStore::apply_locked(const IdentityRecords& records) {
  for (const UserRecord& record : records.users) {
    users_[record.name] = User{record.name, record.admin, record.revoked, record.create_unix_ms};
    token_hashes_[record.token_sha256] = record.name;
    user_hashes_[record.name] = record.token_sha256;
  }
  for (const JoinTokenRecord& token : records.join_tokens)
    join_tokens_[token.secret_sha256] = token.expire_unix_ms;
  for (const CertificateRecord& certificate : records.certificates)
    certificates_[certificate.serial] =
        NodeCertificate{certificate.node_id, certificate.revoked, certificate.not_after_unix_ms};
}

IdentityRecords IdentityStore::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  IdentityRecords out;
  for (const auto& [name, user] : users_) {
    out.users.push_back(
        UserRecord{name, user_hashes_.at(name), user.admin, user.revoked, user.create_unix_ms});
  }
  for (const auto& [hash, expire] : join_tokens_) out.join_tokens.push_back(JoinTokenRecord{hash, expire});
  for (const auto& [serial, certificate] : certificates_)
    out.certificates.push_back(
        CertificateRecord{serial, certificate.node_id, certificate.revoked, certificate.not_after_unix_ms});
  return out;
}

Status IdentityStore::replace_locked(const IdentityRecords& records) {
  COHORT_RETURN_IF_ERROR(db_->transaction([&]() -> Status {
    COHORT_RETURN_IF_ERROR(
        db_->exec("DELETE FROM users; DELETE FROM join_tokens; DELETE FROM node_certificates"));
    COHORT_ASSIGN_OR_RETURN(
        SqliteStatement user,
        db_->prepare(
            "INSERT INTO users (name, token_sha256, admin, revoked, create_unix_ms) VALUES (?, ?, ?, ?, ?)"));
    for (const UserRecord& record : records.users) {
      COHORT_RETURN_IF_ERROR(user.reset());
      COHORT_RETURN_IF_ERROR(user.bind(record.name, record.token_sha256, record.admin ? 1 : 0,
                                       record.revoked ? 1 : 0, record.create_unix_ms));
      COHORT_RETURN_IF_ERROR(user.run());
    }
    COHORT_ASSIGN_OR_RETURN(
        SqliteStatement token,
        db_->prepare("INSERT INTO join_tokens (secret_sha256, expire_unix_ms) VALUES (?, ?)"));
    for (const JoinTokenRecord& record : records.join_tokens) {
      COHORT_RETURN_IF_ERROR(token.reset());
      COHORT_RETURN_IF_ERROR(token.bind(record.secret_sha256, record.expire_unix_ms));
      COHORT_RETURN_IF_ERROR(token.run());
    }
    COHORT_ASSIGN_OR_RETURN(
        SqliteStatement certificate,
        db_->prepare("INSERT INTO node_certificates (serial, node_id, revoked, not_after_unix_ms) VALUES (?, ?, ?, ?)"));
    for (const CertificateRecord& record : records.certificates) {
      COHORT_RETURN_IF_ERROR(certificate.reset());
      COHORT_RETURN_IF_ERROR(
          certificate.bind(record.serial, record.node_id, record.revoked ? 1 : 0, record.not_after_unix_ms));
      COHORT_RETURN_IF_ERROR(certificate.run());
    }
    return ok_status();
  }));
  clear_maps_locked();
  apply_locked(records);
  return ok_status();
}

StatusOr<IdentityStore::JournalSync> IdentityStore::follow_journal(std::shared_ptr<IdentityJournal> journal) {
  if (journal == nullptr) return invalid_argument_error("follow_journal: no journal given");
  std::lock_guard<std::mutex> write(write_mu_);
  JournalSync sync;
  COHORT_ASSIGN_OR_RETURN(std::optional<IdentityRecords> loaded, journal->load());
  if (loaded.has_value()) {
    // The journal wins: what this coordinator's identity.db held may be stale (it did not lead).
    std::lock_guard<std::mutex> lock(mu_);
    COHORT_RETURN_IF_ERROR(replace_locked(*loaded).with_context(
        "caching the identities of " + journal->description() + " in " + db_->path()));
  } else {
    // A new cluster: the local identities (the first admin made at this coordinator's first start,
    // or an identity.db copied by hand before) become everyone's.
    COHORT_RETURN_IF_ERROR(journal->seed(records()));
    sync.seeded = true;
  }
  std::lock_guard<std::mutex> lock(mu_);
  journal_ = std::move(journal);
  sync.users = users_.size();
  sync.join_tokens = join_tokens_.size();
  sync.certificates = certificates_.size();
  return sync;
}

StatusOr<std::string> IdentityStore::add_user(const std::string& name, bool admin) {
  COHORT_RETURN_IF_ERROR(validate_user_name(name));
  std::lock_guard<std::mutex> write(write_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (users_.count(name) != 0) {
      return already_exists_error("user {:?} already exists{}; pick another name", name,
                                  users_[name].revoked ? " (revoked; names are never reused)" : "");
    }
  }
  const std::string token = random_hex(kTokenBytes);
  const std::string hash = sha256_hex(token);
  User user{name, admin, false, unix_ms_now()};
  if (journal_ != nullptr)
    COHORT_RETURN_IF_ERROR(journal_->put_user(UserRecord{name, hash, admin, false, user.create_unix_ms}));
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(
      SqliteStatement insert,
      db_->prepare("INSERT INTO users (name, token_sha256, admin, revoked, create_unix_ms) VALUES (?, ?, ?, 0, ?)"));
  COHORT_RETURN_IF_ERROR(insert.bind(name, hash, admin ? 1 : 0, user.create_unix_ms));
  COHORT_RETURN_IF_ERROR(insert.run());
  users_[name] = user;
  token_hashes_[hash] = name;
  user_hashes_[name] = hash;
  return token;
}

std::vector<User> IdentityStore::list_users() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<User> out;
  for (const auto& [name, user] : users_) out.push_back(user);
  return out;
}

Status IdentityStore::revoke_user(const std::string& name) {
  std::lock_guard<std::mutex> write(write_mu_);
  UserRecord record;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = users_.find(name);
    if (it == users_.end()) return not_found_error("no user {:?}; `cohort user list` shows them", name);
    record = UserRecord{name, user_hashes_[name], it->second.admin, true, it->second.create_unix_ms};
  }
  if (journal_ != nullptr) COHORT_RETURN_IF_ERROR(journal_->put_user(record));
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(SqliteStatement update, db_->prepare("UPDATE users SET revoked = 1 WHERE name = ?"));
  COHORT_RETURN_IF_ERROR(update.bind(name));
  COHORT_RETURN_IF_ERROR(update.run());
  users_[name].revoked = true;
  return ok_status();
}

std::optional<User> IdentityStore::user_by_token(const std::string& token) const {
  // The map lookup is on the token's hash, so its timing reveals nothing usable about the token.
  const std::string hash = sha256_hex(token);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = token_hashes_.find(hash);
  if (it == token_hashes_.end()) return std::nullopt;
  const User& user = users_.at(it->second);
  if (user.revoked) return std::nullopt;
  return user;
}

bool IdentityStore::has_admin() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, user] : users_)
    if (user.admin && !user.revoked) return true;
  return false;
}

StatusOr<std::string> IdentityStore::add_join_token(std::chrono::milliseconds ttl, int64_t now_unix_ms) {
  if (ttl.count() <= 0) ttl = kDefaultJoinTokenTtl;
  if (ttl > kMaxJoinTokenTtl) {
    return invalid_argument_error("a join token may live at most {} h (kMaxJoinTokenTtl); asked for {} h",
                                  std::chrono::duration_cast<std::chrono::hours>(kMaxJoinTokenTtl).count(),
                                  std::chrono::duration_cast<std::chrono::hours>(ttl).count());
  }
  const std::string secret = random_hex(kTokenBytes);
  const std::string hash = sha256_hex(secret);
  const int64_t expire = now_unix_ms + ttl.count();
  std::lock_guard<std::mutex> write(write_mu_);
  COHORT_RETURN_IF_ERROR(prune_expired_join_tokens_locked(now_unix_ms)
                             .status()
                             .with_context("pruning the expired join tokens before making a new one"));
  if (journal_ != nullptr) COHORT_RETURN_IF_ERROR(journal_->put_join_token(JoinTokenRecord{hash, expire}));
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(SqliteStatement insert,
                          db_->prepare("INSERT INTO join_tokens (secret_sha256, expire_unix_ms) VALUES (?, ?)"));
  COHORT_RETURN_IF_ERROR(insert.bind(hash, expire));
  COHORT_RETURN_IF_ERROR(insert.run());
  join_tokens_[hash] = expire;
  return secret;
}

StatusOr<size_t> IdentityStore::prune_expired_join_tokens(int64_t now_unix_ms) {
  std::lock_guard<std::mutex> write(write_mu_);
  return prune_expired_join_tokens_locked(now_unix_ms);
}

StatusOr<size_t> IdentityStore::prune_expired_join_tokens_locked(int64_t now_unix_ms) {
  std::vector<std::string> expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [hash, expire] : join_tokens_)
      if (now_unix_ms >= expire) expired.push_back(hash);  // join_token_valid's test, negated
  }
  if (expired.empty()) return size_t{0};
  if (journal_ != nullptr) COHORT_RETURN_IF_ERROR(journal_->delete_join_tokens(expired));
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_RETURN_IF_ERROR(db_->transaction([&]() -> Status {
    COHORT_ASSIGN_OR_RETURN(SqliteStatement remove,
                            db_->prepare("DELETE FROM join_tokens WHERE secret_sha256 = ?"));
    for (const std::string& hash : expired) {
      COHORT_RETURN_IF_ERROR(remove.reset());
      COHORT_RETURN_IF_ERROR(remove.bind(hash));
      COHORT_RETURN_IF_ERROR(remove.run());
    }
    return ok_status();
  }));
  for (const std::string& hash : expired) join_tokens_.erase(hash);
  return expired.size();
}

bool IdentityStore::join_token_valid(const std::string& secret, int64_t now_unix_ms) const {
  const std::string hash = sha256_hex(secret);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = join_tokens_.find(hash);
  return it != join_tokens_.end() && now_unix_ms < it->second;
}

Status IdentityStore::consume_join_token(const std::string& secret, int64_t now_unix_ms) {
  const std::string hash = sha256_hex(secret);
  const Status invalid = permission_denied_error(
      "the join token is not valid (unknown, expired, or already used by another node); an admin makes a new "
      "one with `cohort node token`");
  std::lock_guard<std::mutex> write(write_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = join_tokens_.find(hash);
    if (it == join_tokens_.end() || now_unix_ms >= it->second) return invalid;
  }
  // Deleted from the journal only if still there: of two coordinators that both believe they may
  // admit with it (a deposed leader and its successor), one wins.
  Status consumed = journal_ != nullptr ? journal_->consume_join_token(hash) : ok_status();
  std::lock_guard<std::mutex> lock(mu_);
  if (consumed.code() == StatusCode::kPermissionDenied) {
    join_tokens_.erase(hash);  // gone from the journal: forget it here too (the database below as well)
  } else if (!consumed.ok()) {
    return consumed;
  }
  COHORT_ASSIGN_OR_RETURN(SqliteStatement remove, db_->prepare("DELETE FROM join_tokens WHERE secret_sha256 = ?"));
  COHORT_RETURN_IF_ERROR(remove.bind(hash));
  COHORT_RETURN_IF_ERROR(remove.run());
  join_tokens_.erase(hash);
  if (!consumed.ok()) return invalid;
  return ok_status();
}

Status IdentityStore::add_node_certificate(const std::string& serial, const std::string& node_id,
                                           int64_t not_after_unix_ms) {
  std::lock_guard<std::mutex> write(write_mu_);
  if (journal_ != nullptr)
    COHORT_RETURN_IF_ERROR(journal_->put_certificates({CertificateRecord{serial, node_id, false, not_after_unix_ms}}));
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(
      SqliteStatement insert,
      db_->prepare("INSERT INTO node_certificates (serial, node_id, revoked, not_after_unix_ms) VALUES (?, ?, 0, ?)"));
  COHORT_RETURN_IF_ERROR(insert.bind(serial, node_id, not_after_unix_ms));
  COHORT_RETURN_IF_ERROR(insert.run());
  certificates_[serial] = NodeCertificate{node_id, false, not_after_unix_ms};
  return ok_status();
}

Status IdentityStore::revoke_node(const std::string& node_id) {
  std::lock_guard<std::mutex> write(write_mu_);
  std::vector<CertificateRecord> revoked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [serial, certificate] : certificates_)
      if (certificate.node_id == node_id)
        revoked.push_back(CertificateRecord{serial, node_id, true, certificate.not_after_unix_ms});
  }
  if (revoked.empty())
    return not_found_error("no certificate was issued to node {:?}; `cohort nodes` lists the nodes", node_id);
  if (journal_ != nullptr) COHORT_RETURN_IF_ERROR(journal_->put_certificates(revoked));
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(SqliteStatement update,
                          db_->prepare("UPDATE node_certificates SET revoked = 1 WHERE node_id = ?"));
  COHORT_RETURN_IF_ERROR(update.bind(node_id));
  COHORT_RETURN_IF_ERROR(update.run());
  for (const CertificateRecord& certificate : revoked) certificates_[certificate.serial].revoked = true;
  return ok_status();
}

bool IdentityStore::certificate_valid(const std::string& serial, const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = certificates_.find(serial);
  return it != certificates_.end() && !it->second.revoked && it->second.node_id == node_id;
}

bool IdentityStore::node_has_valid_certificate(const std::string& node_id, int64_t now_unix_ms) const {
  std::lock_guard<std::mutex> lock(mu_);
  // An expired certificate no longer authenticates anyone (TLS refuses it), so it holds no claim
  // on the node id: the node joins again with a new token instead of needing a revocation first.
  for (const auto& [serial, certificate] : certificates_) {
    if (certificate.node_id == node_id && !certificate.revoked &&
        (certificate.not_after_unix_ms == 0 || now_unix_ms < certificate.not_after_unix_ms))
      return true;
  }
  return false;
}

}  // namespace cohort::coordinator
