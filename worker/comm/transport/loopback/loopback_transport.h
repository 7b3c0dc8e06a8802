#pragma once

// LoopbackTransport: ranks as threads of one process, for fast unit tests of everything above the
// transport. Semantics match the real backends: rendezvous (a send completes only once matched
// by a receive, so algorithms that rely on eager sends deadlock here as they would over UCX with
// large messages), FIFO matching per (source, destination, tag), truncation errors, and fault
// injection (fail_rank) that fails every pending and later transfer with that rank.
//
//   auto fabric = std::make_shared<LoopbackFabric>(4);
//   std::unique_ptr<Transport> t0 = fabric->transport(0);   // one per rank thread

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "worker/comm/transport/transport.h"

namespace cohort::comm {

class LoopbackWork;

// The shared medium of one in-process group of `size` ranks. Thread-safe.
class LoopbackFabric : public std::enable_shared_from_this<LoopbackFabric> {
 public:
  explicit LoopbackFabric(int size);

  int size() const { return size_; }
  // The transport endpoint of `rank`; it keeps the fabric alive.
  std::unique_ptr<Transport> transport(int rank);

  // Fault injection: `rank` is dead from now on; every pending transfer to or from it fails with
  // UNAVAILABLE carrying `reason`, and so does every later one.
  void fail_rank(int rank, const Status& reason);

 private:
  friend class LoopbackTransport;
  friend class LoopbackWork;
  using Key = std::tuple<int, int, uint64_t>;  // source, destination, tag

  std::shared_ptr<TransportWork> post(bool is_send, int self, int peer, uint64_t tag, void* data, size_t bytes);
  Status dead_status(int rank);  // under mutex_
  void cancel(LoopbackWork* work, const Status& reason);

  const int size_;
  std::mutex mutex_;
  std::map<Key, std::deque<std::shared_ptr<LoopbackWork>>> sends_;
  std::map<Key, std::deque<std::shared_ptr<LoopbackWork>>> recvs_;
  std::vector<Status> dead_;  // OK while alive
};

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackFabric> fabric, int rank) : fabric_(std::move(fabric)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return fabric_->size(); }
  std::string_view name() const override { return "loopback"; }
  std::shared_ptr<TransportWork> isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  std::shared_ptr<TransportWork> irecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  Status peer_status(int peer) override;

 private:
  std::shared_ptr<LoopbackFabric> fabric_;
  const int rank_;
};

}  // namespace cohort::comm
