#include "worker/train/metrics_reporter.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "worker/base/grpc_status.h"
#include "worker/base/tls.h"

namespace cohort::train {
namespace {

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// A whole number from a double that may be NaN or out of range (a user's value).
int64_t to_int64(double value) {
  if (!std::isfinite(value)) return 0;
  if (value >= 9.2e18) return INT64_MAX;
  if (value <= -9.2e18) return INT64_MIN;
  return static_cast<int64_t>(std::llround(value));
}

int32_t to_int32(double value) {
  int64_t whole = to_int64(value);
  if (whole > INT32_MAX) return INT32_MAX;
  if (whole < INT32_MIN) return INT32_MIN;
  return static_cast<int32_t>(whole);
}

std::vector<std::string> coordinator_list(const std::string& coordinator) {
  StatusOr<std::vector<std::string>> addresses = tls::parse_address_list(coordinator);
  return addresses.ok() ? *addresses : std::vector<std::string>{coordinator};
}

}  // namespace

MetricsReporter::MetricsReporter(MetricsReporterOptions options)
    : options_(std::move(options)),
      // The attempt's secret authenticates the reports (COHORT_JOB_SECRET, from the agent).
      // One coordinator or the highly available list (issue 16): reports go to the leader.
      leader_(std::make_unique<tls::LeaderChannel>(coordinator_list(options_.coordinator),
                                                   tls::worker_security_from_environment())),
      thread_([this] { send_loop(); }) {}

MetricsReporter::~MetricsReporter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::unique_ptr<MetricsReporter> MetricsReporter::from_environment() {
  MetricsReporterOptions options;
  options.coordinator = env_or_empty("COHORT_COORDINATOR");
  options.job_id = env_or_empty("COHORT_JOB_ID");
  if (options.coordinator.empty() || options.job_id.empty()) return nullptr;
  std::string attempt = env_or_empty("COHORT_ATTEMPT");
  options.attempt = attempt.empty() ? 1 : std::atoi(attempt.c_str());
  return std::make_unique<MetricsReporter>(std::move(options));
}

void MetricsReporter::report(const v1::Metrics& metrics, bool epoch_end) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (epoch_end) {
      // An epoch end supersedes any pending mid-epoch report.
      latest_.reset();
      if (queue_.size() >= kMetricsQueueLimit) queue_.pop_front();
      queue_.push_back(metrics);
    } else {
      // The newest one wins: it replaces a report still held back by the rate limit, and the
      // sending thread sends it once min_interval has passed since the last mid-epoch send.
      latest_ = metrics;
    }
  }
  wake_.notify_one();
}

bool MetricsReporter::flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++flush_waiters_;
  wake_.notify_one();
  const bool done = idle_.wait_for(lock, timeout, [this] { return idle_locked() || stopped_; });
  --flush_waiters_;
  return done && idle_locked();
}

int64_t MetricsReporter::sent() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sent_;
}

int64_t MetricsReporter::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

void MetricsReporter::send_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty() || latest_.has_value(); });
    // Stopping with nothing left to send, or after a failure: the coordinator is likely gone; do
    // not hold up the exit.
    if ((queue_.empty() && !latest_.has_value()) || (stopping_ && failed_ > 0)) break;
    v1::Metrics next;
    if (!queue_.empty()) {
      next = std::move(queue_.front());
      queue_.pop_front();
    } else {
      const auto due = last_accepted_ + options_.min_interval;
      if (!stopping_ && flush_waiters_ == 0 && std::chrono::steady_clock::now() < due) {
        // Rate-limited: wait for the interval to pass (a newer report may replace this one).
        wake_.wait_until(lock, due, [this] { return stopping_ || !queue_.empty() || flush_waiters_ > 0; });
        continue;
      }
      next = std::move(*latest_);
      latest_.reset();
      last_accepted_ = std::chrono::steady_clock::now();
    }
    in_flight_ = true;
    lock.unlock();
    send(next);
    lock.lock();
    in_flight_ = false;
    idle_.notify_all();
  }
  stopped_ = true;
  idle_.notify_all();
}

void MetricsReporter::send(const v1::Metrics& metrics) {
  v1::ReportMetricsRequest request;
  request.set_job_id(options_.job_id);
  request.set_attempt(options_.attempt);
  *request.mutable_metrics() = metrics;
  v1::ReportMetricsResponse response;
  // Safe to send twice (idempotent_unary): a coordinator that holds the report without answering
  // (a stopped leader whose connection stays up) is left after its share of the deadline, so reports
  // reach the one that took over instead of each waiting out rpc_timeout at the hung one. At worst a
  // report the hung leader stored before it stopped appears twice in the history, with the same step.
  Status status = from_grpc_status(
      leader_->idempotent_unary<v1::Coordinator>(std::chrono::system_clock::now() + options_.rpc_timeout,
                                                 &v1::Coordinator::Stub::ReportMetrics, request, &response),
      "Coordinator.ReportMetrics", leader_->leader_address());
  std::lock_guard<std::mutex> lock(mutex_);
  if (status.ok()) {
    ++sent_;
    return;
  }
  ++failed_;
  if (!warned_) {
    warned_ = true;
    spdlog::warn("metrics not reported (training goes on; further failures are not logged): {}",
                 status.to_string());
  }
}

std::vector<std::string> known_metric_names() {
  return {"loss",         "accuracy",         "samples_per_s", "epoch",          "total_steps",
          "total_epochs", "samples_per_step", "comm_wait_s",   "comm_wait_ratio"};
}

v1::Metrics metrics_from_values(const std::vector<std::pair<std::string, double>>& values, int64_t step,
                                int rank, std::vector<std::string>* unknown) {
  v1::Metrics metrics;
  metrics.set_step(step);
  metrics.set_rank(rank);
  for (const auto& [name, value] : values) {
    if (name == "loss") {
      metrics.set_loss(value);
    } else if (name == "accuracy") {
      metrics.set_accuracy(value);
    } else if (name == "samples_per_s") {
      metrics.set_samples_per_s(value);
    } else if (name == "epoch") {
      metrics.set_epoch(to_int32(value));
    } else if (name == "total_steps") {
      metrics.set_total_steps(to_int64(value));
    } else if (name == "total_epochs") {
      metrics.set_total_epochs(to_int32(value));
    } else if (name == "samples_per_step") {
      metrics.set_samples_per_step(to_int64(value));
    } else if (name == "comm_wait_s") {
      metrics.set_comm_wait_s(value);
    } else if (name == "comm_wait_ratio") {
      metrics.set_comm_wait_ratio(value);
    } else if (unknown != nullptr) {
      unknown->push_back(name);
    }
  }
  return metrics;
}

}  // namespace cohort::train
