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
    revoked INTEGER NOT NULL
  );
)sql";

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
  std::unique_ptr<IdentityStore> store(new IdentityStore(std::move(db)));
  COHORT_RETURN_IF_ERROR(store->load());
  return store;
}

Status IdentityStore::load() {
  COHORT_ASSIGN_OR_RETURN(SqliteStatement users,
                          db_->prepare("SELECT name, token_sha256, admin, revoked, create_unix_ms FROM users"));
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, users.step());
    if (!row) break;
    User user{users.column_text(0), users.column_int64(2) != 0, users.column_int64(3) != 0, users.column_int64(4)};
    token_hashes_[users.column_text(1)] = user.name;
    users_[user.name] = user;
  }
  COHORT_ASSIGN_OR_RETURN(SqliteStatement tokens, db_->prepare("SELECT secret_sha256, expire_unix_ms FROM join_tokens"));
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, tokens.step());
    if (!row) break;
    join_tokens_[tokens.column_text(0)] = tokens.column_int64(1);
  }
  COHORT_ASSIGN_OR_RETURN(SqliteStatement certs, db_->prepare("SELECT serial, node_id, revoked FROM node_certificates"));
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, certs.step());
    if (!row) break;
    certificates_[certs.column_text(0)] = NodeCertificate{certs.column_text(1), certs.column_int64(2) != 0};
  }
  return ok_status();
}

StatusOr<std::string> IdentityStore::add_user(const std::string& name, bool admin) {
  COHORT_RETURN_IF_ERROR(validate_user_name(name));
  std::lock_guard<std::mutex> lock(mu_);
  if (users_.count(name) != 0) {
    return already_exists_error("user {:?} already exists{}; pick another name", name,
                                users_[name].revoked ? " (revoked; names are never reused)" : "");
  }
  const std::string token = random_hex(kTokenBytes);
  const std::string hash = sha256_hex(token);
  User user{name, admin, false, unix_ms_now()};
  COHORT_ASSIGN_OR_RETURN(
      SqliteStatement insert,
      db_->prepare("INSERT INTO users (name, token_sha256, admin, revoked, create_unix_ms) VALUES (?, ?, ?, 0, ?)"));
  COHORT_RETURN_IF_ERROR(insert.bind(name, hash, admin ? 1 : 0, user.create_unix_ms));
  COHORT_RETURN_IF_ERROR(insert.run());
  users_[name] = user;
  token_hashes_[hash] = name;
  return token;
}

std::vector<User> IdentityStore::list_users() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<User> out;
  for (const auto& [name, user] : users_) out.push_back(user);
  return out;
}

Status IdentityStore::revoke_user(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = users_.find(name);
  if (it == users_.end()) return not_found_error("no user {:?}; `cohort user list` shows them", name);
  COHORT_ASSIGN_OR_RETURN(SqliteStatement update, db_->prepare("UPDATE users SET revoked = 1 WHERE name = ?"));
  COHORT_RETURN_IF_ERROR(update.bind(name));
  COHORT_RETURN_IF_ERROR(update.run());
  it->second.revoked = true;
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
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(SqliteStatement insert,
                          db_->prepare("INSERT INTO join_tokens (secret_sha256, expire_unix_ms) VALUES (?, ?)"));
  COHORT_RETURN_IF_ERROR(insert.bind(hash, expire));
  COHORT_RETURN_IF_ERROR(insert.run());
  join_tokens_[hash] = expire;
  return secret;
}

bool IdentityStore::join_token_valid(const std::string& secret, int64_t now_unix_ms) const {
  const std::string hash = sha256_hex(secret);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = join_tokens_.find(hash);
  return it != join_tokens_.end() && now_unix_ms < it->second;
}

Status IdentityStore::consume_join_token(const std::string& secret, int64_t now_unix_ms) {
  const std::string hash = sha256_hex(secret);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = join_tokens_.find(hash);
  if (it == join_tokens_.end() || now_unix_ms >= it->second) {
    return permission_denied_error(
        "the join token is not valid (unknown, expired, or already used by another node); an admin makes a new "
        "one with `cohort node token`");
  }
  COHORT_ASSIGN_OR_RETURN(SqliteStatement remove, db_->prepare("DELETE FROM join_tokens WHERE secret_sha256 = ?"));
  COHORT_RETURN_IF_ERROR(remove.bind(hash));
  COHORT_RETURN_IF_ERROR(remove.run());
  join_tokens_.erase(it);
  return ok_status();
}

Status IdentityStore::add_node_certificate(const std::string& serial, const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(SqliteStatement insert,
                          db_->prepare("INSERT INTO node_certificates (serial, node_id, revoked) VALUES (?, ?, 0)"));
  COHORT_RETURN_IF_ERROR(insert.bind(serial, node_id));
  COHORT_RETURN_IF_ERROR(insert.run());
  certificates_[serial] = NodeCertificate{node_id, false};
  return ok_status();
}

Status IdentityStore::revoke_node(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(SqliteStatement select, db_->prepare("SELECT serial FROM node_certificates WHERE node_id = ?"));
  COHORT_RETURN_IF_ERROR(select.bind(node_id));
  std::vector<std::string> serials;
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, select.step());
    if (!row) break;
    serials.push_back(select.column_text(0));
  }
  if (serials.empty())
    return not_found_error("no certificate was issued to node {:?}; `cohort nodes` lists the nodes", node_id);
  COHORT_ASSIGN_OR_RETURN(SqliteStatement update,
                          db_->prepare("UPDATE node_certificates SET revoked = 1 WHERE node_id = ?"));
  COHORT_RETURN_IF_ERROR(update.bind(node_id));
  COHORT_RETURN_IF_ERROR(update.run());
  for (const std::string& serial : serials) certificates_[serial].revoked = true;
  return ok_status();
}

bool IdentityStore::certificate_valid(const std::string& serial, const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = certificates_.find(serial);
  return it != certificates_.end() && !it->second.revoked && it->second.node_id == node_id;
}

bool IdentityStore::node_has_valid_certificate(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [serial, certificate] : certificates_)
    if (certificate.node_id == node_id && !certificate.revoked) return true;
  return false;
}

}  // namespace cohort::coordinator
