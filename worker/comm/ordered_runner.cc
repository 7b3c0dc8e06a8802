#include "worker/comm/ordered_runner.h"

#include <utility>

namespace cohort::comm {

OrderedRunner::OrderedRunner(std::function<void()> on_executor_start)
    : on_executor_start_(std::move(on_executor_start)) {}

OrderedRunner::~OrderedRunner() { stop(); }

void OrderedRunner::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  // The executor drains what is queued first: every queued body has a deadline.
  if (executor_.joinable()) executor_.join();
}

void OrderedRunner::end_inline() {
  running_.store(false, std::memory_order_release);
  // No executor to hand the token to: nothing more. Should the executor start meanwhile and look
  // at the token before this store shows, it looks again by itself (kExecutorTokenRecheck)
  // instead of waiting for a notification that will not come.
  if (!executor_started_.load(std::memory_order_acquire) || plain_token_return_for_testing_) return;
  // The executor checks the token under mutex_: the store came before this thread takes the
  // mutex, so the executor either sees the token back at its check or is already waiting and gets
  // the notification.
  { std::lock_guard<std::mutex> lock(mutex_); }
  cv_.notify_all();
}

Status OrderedRunner::enqueue(std::function<Status()> body, std::shared_ptr<CompletionWork> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      return failed_precondition_error(
          "issued while its communicator is being destroyed (its executor is stopping); issue every "
          "operation before the communicator goes");
    }
    queue_.push_back(Task{std::move(body), std::move(work)});
    queued_.fetch_add(1, std::memory_order_release);
    if (!executor_.joinable()) {
      executor_started_.store(true, std::memory_order_release);
      executor_ = std::thread([this] { executor_loop(); });
    }
  }
  cv_.notify_all();
  return ok_status();
}

void OrderedRunner::executor_loop() {
  if (on_executor_start_) on_executor_start_();
  std::unique_lock<std::mutex> lock(mutex_);
  // The token is taken here, under the mutex: see end_inline().
  auto ready = [this] { return (!queue_.empty() && try_take_token()) || (stopping_ && queue_.empty()); };
  const auto recheck_until = std::chrono::steady_clock::now() + kExecutorTokenRecheckWindow;
  while (true) {
    while (!ready()) {
      // Work waiting for the token looks again now and then: a blocking call that did not see
      // this thread start may give the token back without a notification (see end_inline()),
      // soon after the start or, were its thread stopped, any time later.
      if (queue_.empty()) {
        cv_.wait(lock);
      } else {
        const bool new_thread = std::chrono::steady_clock::now() < recheck_until;
        cv_.wait_for(lock, new_thread ? kExecutorTokenRecheck : kExecutorTokenRecheckLater);
      }
    }
    if (queue_.empty()) return;  // stopping
    Task task = std::move(queue_.front());
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_release);
    lock.unlock();
    Status status = task.body();
    // Back before the waiter wakes, so its next blocking call can run on its own thread. Only
    // this thread waits for the token on cv_: nobody to notify.
    running_.store(false, std::memory_order_release);
    task.work->complete(status);
    lock.lock();
  }
}

}  // namespace cohort::comm
