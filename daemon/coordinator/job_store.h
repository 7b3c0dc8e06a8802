#pragma once

// JobStore: the coordinator's durable memory. Job records and their state-change events live in
// one SQLite database in the data directory (<data_dir>/coordinator.db), so a coordinator that
// restarts — crash, upgrade, reboot — reloads every job it ever accepted.
//
// What is stored: each job's spec (the JobSpec wire bytes), state, reason, attempt, timestamps,
// last metrics and placement; every state-change event; and the job's metrics history, one row per
// report (bounded per job by kMaxMetricsPerJob, thinned when full), so `cohort metrics` shows the
// whole training curve after a restart. The newest metrics also ride along in the job row.
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

// One stored metrics report: the event seq and time that published it, its attempt, its numbers
// (step, epoch, loss, accuracy, samples/s, rank; the run totals are not stored).
struct MetricsRecord {
  int64_t seq = 0;  // the coordinator-wide event seq (WatchJob resumes after it)
  int attempt = 0;
  int64_t unix_ms = 0;
  Metrics metrics;
};

class JobStore {
 public:
  // The database file inside the data directory.
  static constexpr const char* kDatabaseFile = "coordinator.db";
  // The schema version this code writes; older databases are migrated on open.
  static constexpr int kSchemaVersion = 3;
  // Metrics reports kept per job. A job that reports every few seconds for days would otherwise
  // grow the database without bound; when a job has more rows than this, every second row (by seq)
  // is deleted except the first and the newest, halving the resolution of the whole curve while
  // keeping its shape and its ends. Raise it here (and rebuild) to keep finer history.
  static constexpr int64_t kMaxMetricsPerJob = 10000;

  // Everything stored, in submission (jobs) and sequence (events) order.
  struct Snapshot {
    std::vector<Job> jobs;
    std::vector<JobEvent> events;
    int64_t max_metrics_seq = 0;  // the newest stored metrics report's seq (0: none)
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

  // Appends one metrics report of `job_id` (the job must be stored), then thins the job's history
  // if it has more than `max_rows` rows (see kMaxMetricsPerJob).
  Status append_metrics(const std::string& job_id, const MetricsRecord& record,
                        int64_t max_rows = kMaxMetricsPerJob);
  // The job's stored metrics reports with seq > after_seq, oldest first; attempt 0 means every
  // attempt. Empty for a job without reports (or an unknown job).
  StatusOr<std::vector<MetricsRecord>> load_metrics(const std::string& job_id, int64_t after_seq = 0,
                                                    int attempt = 0) const;

  // Reads everything back (jobs, state-change events; not the metrics history, which is read per
  // job with load_metrics). DATA_LOSS when a row cannot be decoded.
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
