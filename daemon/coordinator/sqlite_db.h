#pragma once

// SqliteDb / SqliteStatement: a small RAII layer over the SQLite C API. Every sqlite3_* call goes
// through COHORT_SQLITE_CHECK, which turns a result code into a Status that names the call, the
// file and line, SQLite's own message and what to check (STYLE rule 4).
//
// Neither class is thread-safe; the owner serializes access (the JobStore's owner, the
// Coordinator, holds its lock). All calls block on disk I/O.

#include <sqlite3.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "worker/base/status.h"

namespace cohort::coordinator {

// The Status for a failed SQLite call: "sqlite3_step(stmt) failed at file.cc:12: SQLITE_FULL
// (database or disk is full)". `db` may be null (then only the code's text is used).
Status sqlite_status(sqlite3* db, int rc, std::string_view call, const char* file, int line);

// "sqlite3_step(INSERT INTO events (seq, ...)": a call on a statement, its SQL condensed to one
// short line for error messages.
std::string sqlite_call(std::string_view function, std::string_view sql);

}  // namespace cohort::coordinator

// Evaluates `call` (an expression yielding a SQLite result code); on anything but SQLITE_OK returns
// the error Status from the enclosing function.
#define COHORT_SQLITE_CHECK(db, call)                                                                  \
  do {                                                                                                 \
    const int cohort_sqlite_rc_ = (call);                                                              \
    if (cohort_sqlite_rc_ != SQLITE_OK) {                                                              \
      return ::cohort::coordinator::sqlite_status((db), cohort_sqlite_rc_, #call, __FILE__, __LINE__); \
    }                                                                                                  \
  } while (0)

namespace cohort::coordinator {

// Bytes bound as a BLOB (a plain string binds as TEXT).
struct SqliteBlob {
  std::string_view bytes;
};

// One prepared statement. Move-only; finalized on destruction.
class SqliteStatement {
 public:
  SqliteStatement(SqliteStatement&&) noexcept = default;
  SqliteStatement& operator=(SqliteStatement&&) noexcept = default;

  // Binds the arguments to parameters 1..N in order: integers as INTEGER, floating point as REAL,
  // strings as TEXT, SqliteBlob as BLOB, an empty std::optional as NULL.
  template <typename... Args>
  Status bind(const Args&... args) {
    int index = 0;
    Status status;
    // Left to right, stopping at the first failure (&& short-circuits the fold).
    (void)(((status = bind_one(++index, args)).ok()) && ...);
    return status;
  }

  // Runs one step: true when a row is available, false when the statement is done. Errors name
  // the statement and the caller's file and line (the defaults capture them).
  StatusOr<bool> step(const char* file = __builtin_FILE(), int line = __builtin_LINE());
  // step() for statements that return no rows.
  Status run(const char* file = __builtin_FILE(), int line = __builtin_LINE());
  // Makes the statement runnable again with new bindings.
  Status reset();

  int64_t column_int64(int column) const;
  double column_double(int column) const;
  bool column_is_null(int column) const;
  std::string column_text(int column) const;
  std::string column_blob(int column) const;

 private:
  friend class SqliteDb;
  struct Finalizer {
    void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
  };
  SqliteStatement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}

  Status bind_one(int index, int64_t value);
  Status bind_one(int index, int value) { return bind_one(index, static_cast<int64_t>(value)); }
  Status bind_one(int index, double value);
  Status bind_one(int index, std::string_view value);
  Status bind_one(int index, const std::string& value) { return bind_one(index, std::string_view(value)); }
  Status bind_one(int index, const char* value) { return bind_one(index, std::string_view(value)); }
  Status bind_one(int index, SqliteBlob value);
  Status bind_null(int index);
  // An empty optional binds NULL.
  template <typename T>
  Status bind_one(int index, const std::optional<T>& value) {
    return value ? bind_one(index, *value) : bind_null(index);
  }

  sqlite3* db_ = nullptr;
  std::unique_ptr<sqlite3_stmt, Finalizer> stmt_;
};

// One open database file. Closed on destruction.
class SqliteDb {
 public:
  // Opens (creating if missing) the database at `path`.
  static StatusOr<std::unique_ptr<SqliteDb>> open(const std::string& path);

  // Runs one or more statements that return no rows. Errors name the SQL and the caller's file
  // and line (the defaults capture them), as prepare()'s do.
  Status exec(std::string_view sql, const char* file = __builtin_FILE(), int line = __builtin_LINE());
  // Compiles one statement.
  StatusOr<SqliteStatement> prepare(std::string_view sql, const char* file = __builtin_FILE(),
                                    int line = __builtin_LINE());
  // Runs `body` in BEGIN IMMEDIATE .. COMMIT; rolls back and returns its error if it fails, so
  // either every write of `body` lands or none does.
  Status transaction(const std::function<Status()>& body);
  // A single-integer query, e.g. "PRAGMA user_version".
  StatusOr<int64_t> query_int(std::string_view sql);

  const std::string& path() const { return path_; }
  sqlite3* handle() const { return db_.get(); }

 private:
  struct Closer {
    void operator()(sqlite3* db) const { sqlite3_close(db); }
  };
  SqliteDb(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}

  std::string path_;
  std::unique_ptr<sqlite3, Closer> db_;
};

}  // namespace cohort::coordinator
