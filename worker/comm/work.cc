#include "worker/comm/work.h"

#include <chrono>

namespace cohort::comm {

void CompletionWork::complete(Status status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (result_.has_value()) return;
    result_ = std::move(status);
  }
  done_cv_.notify_all();
}

Status CompletionWork::wait(Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto done = [&] { return result_.has_value(); };
  if (done()) return *result_;  // nothing to wait for: no blocked time
  const auto start = std::chrono::steady_clock::now();
  bool finished = true;
  if (timeout == Duration::max()) {
    done_cv_.wait(lock, done);
  } else {
    finished = done_cv_.wait_for(lock, timeout, done);
  }
  if (blocked_ns_ != nullptr) {
    blocked_ns_->fetch_add(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count(),
        std::memory_order_relaxed);
  }
  if (!finished)
    return deadline_exceeded_error("operation still running after waiting {}", format_duration(timeout));
  return *result_;
}

bool CompletionWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return result_.has_value();
}

Status CompletionWork::error() {
  std::lock_guard<std::mutex> lock(mutex_);
  return result_.has_value() ? *result_ : ok_status();
}

namespace {

// What completed_work() returns: the outcome is fixed at construction, so nothing needs a lock.
class CompletedWork final : public Work {
 public:
  explicit CompletedWork(Status status) : status_(std::move(status)) {}
  using Work::wait;
  Status wait(Duration) override { return status_; }
  bool is_completed() override { return true; }
  Status error() override { return status_; }

 private:
  const Status status_;
};

}  // namespace

std::shared_ptr<Work> completed_work(Status status) {
  return std::make_shared<CompletedWork>(std::move(status));
}

std::shared_ptr<Work> completed_ok_work() {
  // Leaked on purpose: a Work handed out may be waited on during static destruction.
  static CompletedWork* const done = new CompletedWork(ok_status());
  // The aliasing constructor with an empty owner: a non-owning pointer, no control block.
  return std::shared_ptr<Work>(std::shared_ptr<Work>(), done);
}

}  // namespace cohort::comm
