#pragma once

// EtcdCompactor: keeps etcd's history short. etcd keeps every revision of every key until it is
// compacted, and every job store write, metrics report and lease-attached key adds revisions: left
// alone, the database grows until etcd's space quota (2 GiB by default) raises its NOSPACE alarm,
// and then every write of the control plane fails. The leading coordinator compacts the way
// kube-apiserver does: every `interval` it compacts at the revision it read one interval before, so
// between one and two intervals of history stay (a reader a little behind still finds its revision).
//
//   EtcdCompactor compactor(client, etcd::kDefaultCompactionInterval);
//   compactor.tick(std::chrono::steady_clock::now());  // from the leader's periodic loop
//
// Compaction is not fenced: a deposed leader compacting once more only drops history no one reads.
// Not thread-safe: one thread calls tick().

#include <chrono>
#include <cstdint>

#include "daemon/etcd/etcd_client.h"
#include "worker/base/status.h"

namespace cohort::etcd {

// How often the leader compacts (kube-apiserver's --etcd-compaction-interval default).
inline constexpr std::chrono::milliseconds kDefaultCompactionInterval = std::chrono::minutes(5);

class EtcdCompactor {
 public:
  // `client` must outlive this object. `interval` > 0.
  EtcdCompactor(EtcdClient* client, std::chrono::milliseconds interval);

  // Does nothing until an interval has passed since the last round (the first call is a round).
  // A round compacts at the revision the previous round read (if any, and not compacted already)
  // and reads the current revision for the next: at most two etcd calls. An error (etcd
  // unreachable) is returned and the round is tried again at the next interval.
  Status tick(std::chrono::steady_clock::time_point now);

  // The revision compacted last (0: none yet); the revision the next round compacts at (0: none).
  int64_t compacted() const { return compacted_; }
  int64_t pending() const { return pending_; }

 private:
  EtcdClient* const client_;
  const std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point next_{};  // the next round; epoch: at the first tick
  bool started_ = false;
  int64_t pending_ = 0;
  int64_t compacted_ = 0;
};

}  // namespace cohort::etcd
