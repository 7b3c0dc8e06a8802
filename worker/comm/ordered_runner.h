#pragma once

// OrderedRunner: runs a communicator's collectives one at a time, in the order they were issued.
//
// Every rank must issue its collectives in the same order, and one communicator's engine and
// scratch buffers serve one collective at a time, so a communicator runs them under a run token:
// whoever holds it runs one. A blocking call with nothing queued takes the token and runs on its
// own thread (the common small-collective path: one atomic operation, no mutex, no thread
// switch). Everything else is queued for the executor, a thread started on the first queued
// call, which takes the token for each queued body in turn. An operation a thread queued earlier
// is either still counted as queued or holds the token, so a later blocking call on that thread
// waits its turn (it queues too), and issue order holds.
//
// Returning the token is a plain release store until the executor exists. A blocking call that
// raced the executor's start may so give the token back without a notification; a new executor
// therefore looks at a token it waits for by itself, every kExecutorTokenRecheck for its first
// kExecutorTokenRecheckWindow, then every kExecutorTokenRecheckLater (the blocking call's thread
// may have been stopped in between, for as long as anyone likes). Only while work is queued.
//
// Thread-safe. The destructor drains the queue (every queued body has a deadline) and joins the
// executor.
//
//   OrderedRunner runner([] { /* first thing on the executor thread */ });
//   if (blocking && runner.try_run_inline()) { Status s = body(); runner.end_inline(); ... }
//   else if (Status queued = runner.enqueue(body, work); !queued.ok()) { /* stopping */ }
//   // work completes with body's status

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "worker/base/status.h"
#include "worker/comm/work.h"

namespace cohort::comm {

class OrderedRunner {
 public:
  // `on_executor_start` runs first on the executor thread (e.g. to select the rank's GPU).
  explicit OrderedRunner(std::function<void()> on_executor_start = {});
  ~OrderedRunner();
  OrderedRunner(const OrderedRunner&) = delete;
  OrderedRunner& operator=(const OrderedRunner&) = delete;

  // Takes the run token for a body run on this thread, when nothing is queued and nobody holds
  // it. True: run it, then end_inline(). False: enqueue() it.
  bool try_run_inline() {
    return queued_.load(std::memory_order_acquire) == 0 && try_take_token();
  }
  // Gives back the token try_run_inline() took.
  void end_inline();

  // Queues `body` to run on the executor after everything queued before it, then completes
  // `work` with its status (the token is back by then, so the waiter's next blocking call can run
  // inline). Does not block. FAILED_PRECONDITION, with nothing queued and `work` untouched, once
  // stop() has begun.
  Status enqueue(std::function<Status()> body, std::shared_ptr<CompletionWork> work);

  // Runs what is queued and joins the executor; enqueue() refuses from its start on. Idempotent,
  // but from one thread at a time and never from a body (it joins the executor).
  void stop();

  // Tests: end_inline() never notifies the executor, as a blocking call that raced its start does.
  void return_token_plainly_for_testing() { plain_token_return_for_testing_ = true; }

 private:
  // How often the executor looks at a token it waits for without a notification (see the top).
  static constexpr std::chrono::milliseconds kExecutorTokenRecheck{1};
  static constexpr std::chrono::seconds kExecutorTokenRecheckWindow{2};
  static constexpr std::chrono::milliseconds kExecutorTokenRecheckLater{100};

  struct Task {
    std::function<Status()> body;
    std::shared_ptr<CompletionWork> work;
  };

  bool try_take_token() {
    // A plain load first: a busy token costs no atomic write.
    if (running_.load(std::memory_order_relaxed)) return false;
    bool expected = false;
    return running_.compare_exchange_strong(expected, true, std::memory_order_acquire);
  }
  void executor_loop();

  const std::function<void()> on_executor_start_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> queue_;                      // under mutex_
  std::atomic<size_t> queued_{0};               // queue_.size(), readable without the mutex
  std::atomic<bool> running_{false};            // the run token: held while a body runs
  bool stopping_ = false;                       // under mutex_
  std::atomic<bool> executor_started_{false};   // set (under mutex_) when executor_ starts
  bool plain_token_return_for_testing_ = false;
  std::thread executor_;                        // started on the first enqueue()
};

}  // namespace cohort::comm
