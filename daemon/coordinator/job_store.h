#pragma once

// JobStore: the coordinator's durable memory. Job records and their state-change events live in
// one SQLite database in the data directory (<data_dir>/coordinator.db), so a coordinator that
// restarts — crash, upgrade, reboot — reloads every job it ever accepted.
//
// What is stored: each job's spec (the JobSpec wire bytes), state, reason, attempt, timestamps,
// last metrics and placement; and every state-change event. Metrics events are not stored one by
// one (they are frequent and only the newest matters): the newest metrics ride along in the job row
// whenever the job is written.
//
// The database takes an exclusive lock while open, so a second coordinator pointed at the same
// data directory fails to open it instead of double-placing jobs.
//
// Not thread-safe: the Coordinator serializes calls. Every method blocks on disk I/O (writes are
// fsynced before they return).

#include <memory>
#include <string>
#include <vector>

#include "daemon/coordinator/job.h"
#include "daemon/coordinator/sqlite_db.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

class JobStore {
 public:
  // The database file inside the data directory.
  static constexpr const char* kDatabaseFile = "coordinator.db";
  // The schema version this code writes; older databases are migrated on open.
  static constexpr int kSchemaVersion = 2;

  // Everything stored, in submission (jobs) and sequence (events) order.
  struct Snapshot {
    std::vector<Job> jobs;
    std::vector<JobEvent> events;
  };

  // Opens the store in `data_dir`, creating the directory and the database if missing and
  // migrating an older schema. FAILED_PRECONDITION for a database written by a newer cohortd.
  static StatusOr<std::unique_ptr<JobStore>> open(const std::string& data_dir);

  // Writes the whole job record (insert or replace).
  Status upsert_job(const Job& job);
  // Appends one state-change event. INVALID_ARGUMENT for a metrics event (those are not stored).
  Status append_event(const JobEvent& event);
  // Writes a job and the event that changed it in one transaction: both land or neither does.
  Status save(const Job& job, const JobEvent& event);

  // Reads everything back. DATA_LOSS when a row cannot be decoded.
  StatusOr<Snapshot> load_all() const;

  const std::string& path() const { return db_->path(); }

 private:
  explicit JobStore(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}

  Status migrate();
  Status write_job(const Job& job);
  Status write_event(const JobEvent& event);
  StatusOr<Placement> load_placement(const std::string& job_id) const;

  std::unique_ptr<SqliteDb> db_;
};

}  // namespace cohort::coordinator
