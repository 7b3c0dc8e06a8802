#pragma once

// JobStore: the coordinator's durable memory, an interface with two implementations:
//   - SqliteJobStore (sqlite_job_store.h), the embedded default: one SQLite database in the data
//     directory (<data_dir>/coordinator.db); JobStore::open(data_dir) opens it;
//   - EtcdJobStore (daemon/etcd/etcd_job_store.h), for a highly available coordinator
//     (`job_store: etcd://...`): several coordinators share it, the elected leader writes it, and
//     its writes are fenced on the leader's election key.
// A coordinator that restarts (or a standby that takes over) reloads every job ever accepted.
//
// What is stored: each job's spec (the JobSpec wire bytes), state, reason, attempt, timestamps,
// last metrics and placement; every state-change event; and the job's metrics history, one row per
// report (bounded per job by kMaxMetricsPerJob, thinned when full), so `cohort metrics` shows the
// whole training curve after a restart. The newest metrics also ride along in the job record. A
// shared store also keeps the registered nodes (put_node).
//
// Not thread-safe: the Coordinator serializes calls. Every method blocks on I/O (disk or network),
// and a write is durable when it returns OK.

#include <memory>
#include <string>
#include <vector>

#include "daemon/coordinator/job.h"
#include "daemon/coordinator/node_registry.h"
#include "daemon/coordinator/rendezvous_journal.h"
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
  // The SQLite store's database file inside the data directory.
  static constexpr const char* kDatabaseFile = "coordinator.db";
  // The SQLite schema version this code writes; older databases are migrated on open.
  static constexpr int kSchemaVersion = 5;
  // Metrics reports kept per job. A job that reports every few seconds for days would otherwise
  // grow the store without bound; when a job has more rows than this, every second row (by seq)
  // is deleted except the first and the newest, halving the resolution of the whole curve while
  // keeping its shape and its ends. Raise it here (and rebuild) to keep finer history.
  static constexpr int64_t kMaxMetricsPerJob = 10000;

  // Everything stored, in submission (jobs) and sequence (events) order.
  struct Snapshot {
    std::vector<Job> jobs;
    std::vector<JobEvent> events;
    int64_t max_metrics_seq = 0;  // the newest stored metrics report's seq (0: none)
    // The highest job / event seq of the jobs deleted by delete_job (0: none); ids and seqs are
    // never reused, so new ones start above these too.
    int64_t retired_job_seq = 0;
    int64_t retired_event_seq = 0;
    // The node records (see put_node), by node id; always empty from a store that keeps none.
    std::vector<NodeInfo> nodes;
  };

  // Opens the default store, SQLite in `data_dir` (SqliteJobStore::open): creates the directory
  // and the database if missing and migrates an older schema. FAILED_PRECONDITION for a database
  // written by a newer cohortd.
  static StatusOr<std::unique_ptr<JobStore>> open(const std::string& data_dir);

  virtual ~JobStore() = default;

  // Writes the whole job record (insert or replace).
  virtual Status upsert_job(const Job& job) = 0;
  // Appends one state-change event. INVALID_ARGUMENT for a metrics event (those are not stored).
  virtual Status append_event(const JobEvent& event) = 0;
  // Writes a job and the event that changed it in one transaction: both land or neither does.
  virtual Status save(const Job& job, const JobEvent& event) = 0;

  // Appends one metrics report of `job_id` (the job must be stored), then thins the job's history
  // if it has more than `max_rows` rows (see kMaxMetricsPerJob).
  virtual Status append_metrics(const std::string& job_id, const MetricsRecord& record,
                                int64_t max_rows = kMaxMetricsPerJob) = 0;
  // The job's stored metrics reports with seq > after_seq, oldest first; attempt 0 means every
  // attempt. Empty for a job without reports (or an unknown job).
  virtual StatusOr<std::vector<MetricsRecord>> load_metrics(const std::string& job_id, int64_t after_seq = 0,
                                                            int attempt = 0) const = 0;

  // Deletes a job and everything stored with it (placement, state events, metrics history), in
  // one transaction, keeping its seqs as retired (Snapshot::retired_job_seq). The coordinator calls
  // it when a finished job's retention period is over. OK for an unknown job.
  virtual Status delete_job(const std::string& job_id) = 0;

  // Node records (issue 16): a store that several coordinators share (etcd) keeps each registered
  // node's NodeInfo, so a coordinator taking over knows the cluster at once (Snapshot::nodes)
  // instead of only as agents find it and register again. The Coordinator writes a record when a
  // node registers with info that differs from the stored one (never per heartbeat) and deletes it
  // when the node is lost or removed. The records are a head start, not the truth: a node is
  // schedulable again only once its agent registers with the new coordinator, so a failed or stale
  // write costs a takeover a few seconds, never a job. A store that one coordinator owns (SQLite)
  // keeps none: put_node and delete_node are no-ops there (see SqliteJobStore).
  virtual Status put_node(const NodeInfo& node) = 0;
  // OK for a node without a record.
  virtual Status delete_node(const std::string& node_id) = 0;

  // Rendezvous state (issue 16): a store that several coordinators share (etcd) journals each placed
  // attempt's rendezvous (rendezvous_journal.h), so a coordinator taking over continues it. The
  // journal of `attempt` of `job_id` (made when the attempt is placed or recovered), or null: the
  // rendezvous stays in memory (SQLite, the default here). Unlike the other methods, the journal
  // is called from the rendezvous's threads, outside the Coordinator's lock, and must be
  // thread-safe. A store with journals drops an attempt's state in the same write that moves its
  // job out of PLACED / RUNNING (save / upsert_job), and with delete_job; the etcd store also
  // refuses a journal write for an attempt whose state was dropped (one still in flight when the
  // attempt ended), so nothing outlives the attempt.
  virtual std::shared_ptr<RendezvousJournal> rendezvous_journal(const std::string& /*job_id*/,
                                                                int /*attempt*/) {
    return nullptr;
  }
  // Makes the journal of an attempt this coordinator recovered as PLACED / RUNNING accept writes,
  // if it does not already: the etcd store opens an attempt's journal in the save that places it,
  // and one placed by a coordinator that did not (an older version, before a rolling upgrade) is
  // opened here instead. Fenced like every write; OK when already open or without journals.
  virtual Status open_rendezvous_journal(const std::string& /*job_id*/, int /*attempt*/) {
    return ok_status();
  }
  // What the journal of `attempt` of `job_id` holds (empty when it holds nothing). DATA_LOSS for a
  // record that cannot be decoded.
  virtual StatusOr<RendezvousState> load_rendezvous(const std::string& /*job_id*/, int /*attempt*/) const {
    return RendezvousState{};
  }

  // Reads everything back (jobs, state-change events, node records; not the metrics history, which
  // is read per job with load_metrics). DATA_LOSS when a record cannot be decoded.
  virtual StatusOr<Snapshot> load_all() const = 0;

  // Where the records live, for logs: the database file, or etcd://<endpoints><prefix>.
  virtual const std::string& path() const = 0;
};

}  // namespace cohort::coordinator
