#pragma once

// SqliteJobStore: the embedded default JobStore. Job records, their placements, state-change
// events and metrics history live in one SQLite database in the data directory
// (<data_dir>/coordinator.db, JobStore::kDatabaseFile), migrated on open to kSchemaVersion.
//
// The database takes an exclusive lock while open, so a second coordinator pointed at the same
// data directory fails to open it instead of double-placing jobs. WAL + synchronous=FULL: a write
// that returned OK survives a crash or power loss.
//
// Not thread-safe: the Coordinator serializes calls. Every method blocks on disk I/O.

#include <memory>
#include <string>
#include <vector>

#include "daemon/coordinator/job_store.h"
#include "daemon/coordinator/sqlite_db.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

class SqliteJobStore final : public JobStore {
 public:
  // See JobStore::open.
  static StatusOr<std::unique_ptr<SqliteJobStore>> open(const std::string& data_dir);

  Status upsert_job(const Job& job) override;
  Status append_event(const JobEvent& event) override;
  Status save(const Job& job, const JobEvent& event) override;
  Status append_metrics(const std::string& job_id, const MetricsRecord& record,
                        int64_t max_rows = kMaxMetricsPerJob) override;
  StatusOr<std::vector<MetricsRecord>> load_metrics(const std::string& job_id, int64_t after_seq = 0,
                                                    int attempt = 0) const override;
  Status delete_job(const std::string& job_id) override;
  // No node records: this store has one coordinator, whose restart the agents notice at their next
  // heartbeat (NOT_FOUND) and answer by registering within one heartbeat interval, so records would
  // only fill `cohort nodes` for those seconds, at the price of an fsync'd write per registration
  // and a schema migration. The HA coordinator, whose takeover must be quick while clients go on
  // submitting, keeps them in etcd (EtcdJobStore).
  Status put_node(const NodeInfo& /*node*/) override { return ok_status(); }
  Status delete_node(const std::string& /*node_id*/) override { return ok_status(); }
  StatusOr<Snapshot> load_all() const override;
  const std::string& path() const override { return db_->path(); }

 private:
  explicit SqliteJobStore(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}

  Status migrate();
  Status write_job(const Job& job);
  Status write_event(const JobEvent& event);
  StatusOr<Placement> load_placement(const std::string& job_id) const;

  std::unique_ptr<SqliteDb> db_;
};

}  // namespace cohort::coordinator
