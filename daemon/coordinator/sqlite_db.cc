#include "daemon/coordinator/sqlite_db.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <climits>

namespace cohort::coordinator {

namespace {

StatusCode code_for(int rc) {
  switch (rc & 0xff) {  // the primary code; extended codes carry detail in the high bits
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return StatusCode::kUnavailable;
    case SQLITE_FULL:
    case SQLITE_NOMEM:
      return StatusCode::kResourceExhausted;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return StatusCode::kDataLoss;
    case SQLITE_PERM:
    case SQLITE_READONLY:
    case SQLITE_AUTH:
    case SQLITE_CANTOPEN:
      return StatusCode::kPermissionDenied;
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
      return StatusCode::kFailedPrecondition;
    default:
      return StatusCode::kInternal;
  }
}

std::string_view advice_for(int rc) {
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return "; is another coordinator using this data directory?";
    case SQLITE_FULL:
      return "; free disk space in the data directory";
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return "; the job database is damaged: restore it or start with an empty data directory";
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return "; check that the data directory exists and is writable";
    default:
      return "";
  }
}

}  // namespace

Status sqlite_status(sqlite3* db, int rc, std::string_view call, const char* file, int line) {
  // sqlite3_errmsg describes the latest failure on `db`, which is this one; without a handle the
  // code's generic text is all there is.
  const char* detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  return Status(code_for(rc), fmt::format("{} failed at {}:{}: {} (code {}){}", call, file, line, detail, rc,
                                          advice_for(rc)));
}

std::string sqlite_call(std::string_view function, std::string_view sql) {
  // Whitespace runs collapse to one space; long statements are cut, enough to recognise them.
  constexpr size_t kMaxSqlChars = 72;
  std::string brief;
  bool space = false;
  for (char c : sql) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      space = !brief.empty();
      continue;
    }
    if (space) brief += ' ';
    space = false;
    brief += c;
    if (brief.size() >= kMaxSqlChars) {
      brief += " ...";
      break;
    }
  }
  return fmt::format("{}({})", function, brief);
}

Status SqliteStatement::bind_one(int index, int64_t value) {
  COHORT_SQLITE_CHECK(db_, sqlite3_bind_int64(stmt_.get(), index, value));
  return ok_status();
}

Status SqliteStatement::bind_one(int index, double value) {
  COHORT_SQLITE_CHECK(db_, sqlite3_bind_double(stmt_.get(), index, value));
  return ok_status();
}

Status SqliteStatement::bind_one(int index, std::string_view value) {
  if (value.size() > static_cast<size_t>(INT_MAX))
    return invalid_argument_error("text of {} bytes is too large", value.size());
  COHORT_SQLITE_CHECK(db_, sqlite3_bind_text(stmt_.get(), index, value.data(), static_cast<int>(value.size()),
                                             SQLITE_TRANSIENT));
  return ok_status();
}

Status SqliteStatement::bind_one(int index, SqliteBlob value) {
  if (value.bytes.size() > static_cast<size_t>(INT_MAX)) {
    return invalid_argument_error("blob of {} bytes is too large", value.bytes.size());
  }
  COHORT_SQLITE_CHECK(db_, sqlite3_bind_blob(stmt_.get(), index, value.bytes.data(),
                                             static_cast<int>(value.bytes.size()), SQLITE_TRANSIENT));
  return ok_status();
}

Status SqliteStatement::bind_null(int index) {
  COHORT_SQLITE_CHECK(db_, sqlite3_bind_null(stmt_.get(), index));
  return ok_status();
}

StatusOr<bool> SqliteStatement::step(const char* file, int line) {
  const int rc = sqlite3_step(stmt_.get());
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return sqlite_status(db_, rc, sqlite_call("sqlite3_step", sqlite3_sql(stmt_.get())), file, line);
}

Status SqliteStatement::run(const char* file, int line) {
  COHORT_ASSIGN_OR_RETURN(bool row, step(file, line));
  (void)row;  // statements run this way return no rows; a row would simply be ignored
  return ok_status();
}

Status SqliteStatement::reset() {
  COHORT_SQLITE_CHECK(db_, sqlite3_reset(stmt_.get()));
  COHORT_SQLITE_CHECK(db_, sqlite3_clear_bindings(stmt_.get()));
  return ok_status();
}

int64_t SqliteStatement::column_int64(int column) const { return sqlite3_column_int64(stmt_.get(), column); }

double SqliteStatement::column_double(int column) const { return sqlite3_column_double(stmt_.get(), column); }

bool SqliteStatement::column_is_null(int column) const {
  return sqlite3_column_type(stmt_.get(), column) == SQLITE_NULL;
}

std::string SqliteStatement::column_text(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_.get(), column);
  const int size = sqlite3_column_bytes(stmt_.get(), column);
  if (text == nullptr) return std::string();
  return std::string(reinterpret_cast<const char*>(text), static_cast<size_t>(size));
}

std::string SqliteStatement::column_blob(int column) const {
  const void* blob = sqlite3_column_blob(stmt_.get(), column);
  const int size = sqlite3_column_bytes(stmt_.get(), column);
  if (blob == nullptr) return std::string();
  return std::string(static_cast<const char*>(blob), static_cast<size_t>(size));
}

StatusOr<std::unique_ptr<SqliteDb>> SqliteDb::open(const std::string& path) {
  // Created (or narrowed to) 0600 before SQLite opens it: job specs and token hashes are the
  // coordinator's alone, and SQLite gives its -wal and -shm files the database file's mode.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return internal_error("cannot open the database {}: {}", path, std::strerror(errno));
  ::fchmod(fd, 0600);
  ::close(fd);
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  // sqlite3_open_v2 hands back a handle even on failure (for its message); it must be closed.
  std::unique_ptr<SqliteDb> db(new SqliteDb(path, raw));
  if (rc != SQLITE_OK) {
    return sqlite_status(raw, rc, "sqlite3_open_v2", __FILE__, __LINE__).with_context(path);
  }
  COHORT_SQLITE_CHECK(raw, sqlite3_extended_result_codes(raw, 1));
  return db;
}

Status SqliteDb::exec(std::string_view sql, const char* file, int line) {
  const std::string text(sql);
  const int rc = sqlite3_exec(db_.get(), text.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return sqlite_status(db_.get(), rc, sqlite_call("sqlite3_exec", sql), file, line);
  return ok_status();
}

StatusOr<SqliteStatement> SqliteDb::prepare(std::string_view sql, const char* file, int line) {
  if (sql.size() > static_cast<size_t>(INT_MAX)) return invalid_argument_error("SQL of {} bytes", sql.size());
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v2(db_.get(), sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return sqlite_status(db_.get(), rc, sqlite_call("sqlite3_prepare_v2", sql), file, line);
  }
  return SqliteStatement(db_.get(), stmt);
}

Status SqliteDb::transaction(const std::function<Status()>& body) {
  // IMMEDIATE takes the write lock up front, so the body never fails half-way on lock upgrade.
  COHORT_RETURN_IF_ERROR(exec("BEGIN IMMEDIATE"));
  Status status = body();
  if (status.ok()) status = exec("COMMIT");
  if (!status.ok()) {
    exec("ROLLBACK").ignore_error();  // the body's error is the one worth reporting
    return status;
  }
  return ok_status();
}

StatusOr<int64_t> SqliteDb::query_int(std::string_view sql) {
  COHORT_ASSIGN_OR_RETURN(SqliteStatement stmt, prepare(sql));
  COHORT_ASSIGN_OR_RETURN(bool row, stmt.step());
  if (!row) return internal_error("'{}' returned no row", sql);
  return stmt.column_int64(0);
}

}  // namespace cohort::coordinator
