#pragma once

// EtcdJobStore: the coordinator's job store in etcd (`job_store: etcd://h:p,h:p`), for a highly
// available coordinator: whichever coordinator leads reads the same records. It stores what the
// SQLite store does (job records with their placements, i.e. every rank assignment; state-change
// events; each job's metrics history with the same bound; retired seqs), one protobuf message per
// key (job_records.proto):
//
//   <prefix>/jobs/<job id>                    StoredJob
//   <prefix>/events/<job id>/<seq:020>        StoredEvent
//   <prefix>/metrics/<job id>/<seq:020>       StoredMetricsRecord
//   <prefix>/meta/max_metrics_seq             decimal: the newest metrics report's seq
//   <prefix>/meta/retired_job_seq             decimal: highest seq of a deleted job
//   <prefix>/meta/retired_event_seq           decimal: highest event seq of a deleted job
//   <prefix>/nodes/<node id>                  StoredNode (a registered node, JobStore::put_node)
//   <prefix>/rendezvous/<job id>/<attempt:010>/...  a PLACED / RUNNING attempt's rendezvous journal
//                                             (etcd_rendezvous_journal.h: progress, kv/<key>, req/<id>)
//
// Fencing: with a fence set (set_fence, the LeaderKey this coordinator won), every write is one
// etcd transaction that first compares the leader key's create revision; a coordinator that has
// been deposed (its key expired or was replaced) gets FAILED_PRECONDITION and writes nothing, so it
// can never overwrite what its successor wrote. Each save (job + event) is one transaction: both
// land or neither does.
//
// Cost: save / upsert_job / append_event are one Txn request each; append_metrics is one Txn
// (plus, once per job after a restart, one Range counting its history, and a thinning pass of a
// few Txns when the bound is hit); put_node / delete_node are one Txn each, made when a node
// registers with changed info or is lost, never per heartbeat; load_all reads the four prefixes
// page by page. Rendezvous: one Txn when an attempt's join completes, per barrier opening, per
// leave and per store write (set, add, compare_set, delete of an existing key); none per wait,
// get or check; the attempt's journal is opened inside the save that places it and deleted inside
// the save that ends it (a journal write for an attempt not open is refused). A takeover costs,
// per recovered attempt, one Txn (open_rendezvous_journal: it finds the journal open, or opens one
// placed by an older coordinator) and load_rendezvous's read of the attempt's prefix.
//
// Not thread-safe (the Coordinator serializes calls, as with the SQLite store); every method blocks
// on etcd round trips, bounded by the EtcdClient's call timeout.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/coordinator/job_store.h"
#include "daemon/etcd/etcd_client.h"
#include "worker/base/status.h"

namespace cohort::etcd {

// Key prefix of a coordinator cluster's records when the config names none.
inline constexpr const char* kDefaultStorePrefix = "/cohort";
// Keys read per Range page in load_all (a page stays far below gRPC's 4 MiB message limit).
inline constexpr int64_t kLoadPageSize = 500;

class EtcdJobStore final : public coordinator::JobStore {
 public:
  // `client` must outlive the store. `prefix`: the key prefix of this coordinator cluster's
  // records (no trailing '/'). Reads nothing yet. INVALID_ARGUMENT for an empty prefix.
  static StatusOr<std::unique_ptr<EtcdJobStore>> open(EtcdClient* client,
                                                      std::string prefix = kDefaultStorePrefix);

  // Fences every later write on `leader` (see above); std::nullopt: unfenced writes (a single
  // coordinator without an election, and tests).
  void set_fence(std::optional<LeaderKey> leader) { fence_ = std::move(leader); }
  const std::optional<LeaderKey>& fence() const { return fence_; }

  Status upsert_job(const coordinator::Job& job) override;
  Status append_event(const coordinator::JobEvent& event) override;
  Status save(const coordinator::Job& job, const coordinator::JobEvent& event) override;
  Status append_metrics(const std::string& job_id, const coordinator::MetricsRecord& record,
                        int64_t max_rows = kMaxMetricsPerJob) override;
  StatusOr<std::vector<coordinator::MetricsRecord>> load_metrics(const std::string& job_id,
                                                                 int64_t after_seq = 0,
                                                                 int attempt = 0) const override;
  Status delete_job(const std::string& job_id) override;
  Status put_node(const coordinator::NodeInfo& node) override;
  Status delete_node(const std::string& node_id) override;
  StatusOr<Snapshot> load_all() const override;
  const std::string& path() const override { return description_; }
  // An EtcdRendezvousJournal under rendezvous_prefix(job_id, attempt), fenced as this store is now
  // (set_fence first). Thread-safe, unlike the store's other methods.
  std::shared_ptr<coordinator::RendezvousJournal> rendezvous_journal(const std::string& job_id,
                                                                     int attempt) override;
  Status open_rendezvous_journal(const std::string& job_id, int attempt) override;
  StatusOr<coordinator::RendezvousState> load_rendezvous(const std::string& job_id,
                                                         int attempt) const override;

  // Key helpers (tests read the layout).
  std::string job_key(const std::string& job_id) const;
  std::string event_key(const std::string& job_id, int64_t seq) const;
  std::string metrics_prefix(const std::string& job_id) const;
  std::string node_key(const std::string& node_id) const;
  // Every rendezvous journal of a job, and one attempt's (both end in '/').
  std::string rendezvous_prefix(const std::string& job_id) const;
  std::string rendezvous_prefix(const std::string& job_id, int attempt) const;

 private:
  EtcdJobStore(EtcdClient* client, std::string prefix);

  // Runs `ops` in one transaction behind the fence. FAILED_PRECONDITION when the fence fails.
  // With `must_exist` set, that key must exist too (NOT_FOUND otherwise).
  Status write(etcdserverpb::TxnRequest request, const std::string& what, const std::string& must_exist = "");
  StatusOr<etcdserverpb::RequestOp> job_put(const coordinator::Job& job) const;
  StatusOr<etcdserverpb::RequestOp> event_put(const coordinator::JobEvent& event) const;
  // Every key under `prefix`, in key order, read in pages of kLoadPageSize.
  StatusOr<std::vector<KeyValue>> range_all(const std::string& prefix) const;
  StatusOr<int64_t> read_counter(const std::string& key) const;
  Status thin_metrics(const std::string& job_id);

  EtcdClient* const client_;
  const std::string prefix_;
  const std::string description_;  // "etcd://<endpoints><prefix>" for logs
  std::optional<LeaderKey> fence_;
  std::map<std::string, int64_t> metrics_rows_;  // job id -> stored metrics rows (cached count)
  int64_t max_metrics_seq_ = -1;                 // cached <prefix>/meta/max_metrics_seq (-1: unread)
};

}  // namespace cohort::etcd
