#pragma once

// Work: the handle of an asynchronous operation (a point-to-point transfer or a collective).
// Follows c10d's contract: wait(timeout), is_completed(), error(). Every operation carries its own
// deadline, so it always completes (successfully or with an error) within that time.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"

namespace cohort::comm {

class Work {
 public:
  virtual ~Work() = default;

  // Blocks until the operation finishes or `timeout` passes. Returns the operation's status, or
  // DEADLINE_EXCEEDED if `timeout` ran out first (the operation then continues and fails on its
  // own deadline). Thread-safe.
  virtual Status wait(Duration timeout) = 0;
  // Blocks until the operation finishes; it does, within its own deadline.
  Status wait() { return wait(Duration::max()); }

  // Non-blocking. True once the operation succeeded or failed.
  virtual bool is_completed() = 0;
  // OK while pending or after success; the failure otherwise. Non-blocking.
  virtual Status error() = 0;
};

// A Work completed by another thread through complete(). The building block for collectives run
// on a communicator's executor and for the loopback transport.
class CompletionWork : public Work {
 public:
  CompletionWork() = default;
  // Adds the time each wait() blocks (nanoseconds) to `*blocked_ns`, which the work shares with
  // its issuer (a communicator's blocked_time(); the work may outlive it). Null: counts nothing.
  explicit CompletionWork(std::shared_ptr<std::atomic<int64_t>> blocked_ns) : blocked_ns_(std::move(blocked_ns)) {}

  // Finishes the work with `status` and wakes every waiter. Later calls are ignored.
  void complete(Status status);

  using Work::wait;
  Status wait(Duration timeout) override;
  bool is_completed() override;
  Status error() override;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  std::optional<Status> result_;
  const std::shared_ptr<std::atomic<int64_t>> blocked_ns_;
};

// An already finished Work (e.g. a zero-byte operation, or an argument error found at the call).
// Immutable: wait(), is_completed() and error() take no lock.
std::shared_ptr<Work> completed_work(Status status);

// A finished OK Work shared by every caller (a successful blocking collective): the same object
// each time, never freed, and the pointer owns nothing, so handing it out allocates nothing and
// touches no reference count (use_count() is 0).
std::shared_ptr<Work> completed_ok_work();

}  // namespace cohort::comm
