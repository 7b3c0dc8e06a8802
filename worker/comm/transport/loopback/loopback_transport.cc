#include "worker/comm/transport/loopback/loopback_transport.h"

#include <cstring>

namespace cohort::comm {

// One posted send or receive. State moves kQueued → kMatched (popped, copy in flight outside the
// fabric lock) → done; cancel() removes a queued work or waits out an in-flight copy.
class LoopbackWork final : public TransportWork {
 public:
  using Key = LoopbackFabric::Key;

  LoopbackWork(std::shared_ptr<LoopbackFabric> fabric, Key key, bool is_send, void* data, size_t bytes)
      : fabric_(std::move(fabric)), key_(key), is_send_(is_send), data_(data), bytes_(bytes) {}

  Status wait(Duration timeout) override { return done_.wait(timeout); }
  bool is_completed() override { return done_.is_completed(); }
  Status error() override { return done_.error(); }
  void cancel(Status reason) override { fabric_->cancel(this, reason); }
  size_t received_bytes() const override { return received_; }

 private:
  friend class LoopbackFabric;

  std::shared_ptr<LoopbackFabric> fabric_;
  const Key key_;
  const bool is_send_;
  void* const data_;
  const size_t bytes_;
  bool matched_ = false;  // guarded by the fabric's mutex
  size_t received_ = 0;
  CompletionWork done_;
};

LoopbackFabric::LoopbackFabric(int size) : size_(size), dead_(size) {}

std::unique_ptr<Transport> LoopbackFabric::transport(int rank) {
  return std::make_unique<LoopbackTransport>(shared_from_this(), rank);
}

Status LoopbackFabric::dead_status(int rank) {
  return dead_[rank].ok() ? ok_status() : unavailable_error("peer rank {} failed: {}", rank, dead_[rank].message());
}

std::shared_ptr<TransportWork> LoopbackFabric::post(bool is_send, int self, int peer, uint64_t tag, void* data,
                                                    size_t bytes) {
  if (peer < 0 || peer >= size_ || peer == self) {
    auto invalid = std::make_shared<LoopbackWork>(shared_from_this(), Key{}, is_send, nullptr, 0);
    invalid->done_.complete(invalid_argument_error("rank {}: {} peer rank {} is not another rank of this {}-rank group",
                                                   self, is_send ? "send to" : "receive from", peer, size_));
    return invalid;
  }
  Key key = is_send ? Key{self, peer, tag} : Key{peer, self, tag};
  auto work = std::make_shared<LoopbackWork>(shared_from_this(), key, is_send, data, bytes);
  std::shared_ptr<LoopbackWork> match;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Status dead = !dead_[self].ok() ? dead_status(self) : dead_status(peer);
    if (!dead.ok()) {
      work->done_.complete(dead);
      return work;
    }
    auto& opposite = is_send ? recvs_ : sends_;
    auto it = opposite.find(key);
    if (it == opposite.end() || it->second.empty()) {
      (is_send ? sends_ : recvs_)[key].push_back(work);
      return work;
    }
    match = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) opposite.erase(it);
    match->matched_ = true;
    work->matched_ = true;
  }
  // Copy outside the lock so unrelated pairs move data in parallel.
  LoopbackWork* send = is_send ? work.get() : match.get();
  LoopbackWork* recv = is_send ? match.get() : work.get();
  Status status;
  if (send->bytes_ > recv->bytes_) {
    status = invalid_argument_error("message truncated: rank {} sent {} bytes with tag {} but rank {} posted a {}-byte receive",
                                    std::get<0>(key), send->bytes_, std::get<2>(key), std::get<1>(key), recv->bytes_);
  } else {
    if (send->bytes_ > 0) std::memcpy(recv->data_, send->data_, send->bytes_);
    recv->received_ = send->bytes_;
  }
  send->done_.complete(status);
  recv->done_.complete(status);
  return work;
}

void LoopbackFabric::cancel(LoopbackWork* work, const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!work->matched_) {
      auto& queues = work->is_send_ ? sends_ : recvs_;
      auto it = queues.find(work->key_);
      if (it != queues.end()) {
        auto& queue = it->second;
        for (auto q = queue.begin(); q != queue.end(); ++q) {
          if (q->get() == work) {
            queue.erase(q);
            break;
          }
        }
        if (queue.empty()) queues.erase(it);
      }
      work->done_.complete(reason);
      return;
    }
  }
  // Matched: the copy is in flight on another thread and finishes promptly.
  work->done_.wait().ignore_error();
}

void LoopbackFabric::fail_rank(int rank, const Status& reason) {
  std::vector<std::shared_ptr<LoopbackWork>> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dead_[rank] = reason.ok() ? unavailable_error("killed") : reason;
    for (auto* queues : {&sends_, &recvs_}) {
      for (auto it = queues->begin(); it != queues->end();) {
        auto [src, dst, tag] = it->first;
        if (src == rank || dst == rank) {
          for (auto& work : it->second) failed.push_back(work);
          it = queues->erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  Status status = unavailable_error("peer rank {} failed: {}", rank, reason.message());
  for (auto& work : failed) work->done_.complete(status);
}

std::shared_ptr<TransportWork> LoopbackTransport::isend(int peer, uint64_t tag, const void* data, size_t bytes) {
  return fabric_->post(true, rank_, peer, tag, const_cast<void*>(data), bytes);
}

std::shared_ptr<TransportWork> LoopbackTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  return fabric_->post(false, rank_, peer, tag, data, bytes);
}

Status LoopbackTransport::peer_status(int peer) {
  std::lock_guard<std::mutex> lock(fabric_->mutex_);
  return fabric_->dead_status(peer);
}

}  // namespace cohort::comm
