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

std::shared_ptr<Work> completed_work(Status status) {
  auto work = std::make_shared<CompletionWork>();
  work->complete(std::move(status));
  return work;
}

}  // namespace cohort::comm
