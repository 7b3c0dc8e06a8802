#include "worker/runner/metrics_reporter.h"

#include "worker/base/tls.h"

#include <cstdlib>
#include <utility>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "daemon/service/grpc_status.h"

namespace cohort::worker {
namespace {

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

MetricsReporter::MetricsReporter(MetricsReporterOptions options)
    : options_(std::move(options)),
      // The attempt's secret authenticates the reports (COHORT_JOB_SECRET, from the agent).
      stub_(v1::Coordinator::NewStub(tls::make_channel(options_.coordinator, tls::worker_security_from_environment()))),
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
    if (queue_.empty() && !latest_.has_value()) return;  // stopping with nothing left to send
    // Stopping after a failure: the coordinator is likely gone; do not hold up the exit.
    if (stopping_ && failed_ > 0) return;
    v1::Metrics next;
    if (!queue_.empty()) {
      next = std::move(queue_.front());
      queue_.pop_front();
    } else {
      const auto due = last_accepted_ + options_.min_interval;
      if (!stopping_ && std::chrono::steady_clock::now() < due) {
        // Rate-limited: wait for the interval to pass (a newer report may replace this one).
        wake_.wait_until(lock, due, [this] { return stopping_ || !queue_.empty(); });
        continue;
      }
      next = std::move(*latest_);
      latest_.reset();
      last_accepted_ = std::chrono::steady_clock::now();
    }
    lock.unlock();
    send(next);
    lock.lock();
  }
}

void MetricsReporter::send(const v1::Metrics& metrics) {
  v1::ReportMetricsRequest request;
  request.set_job_id(options_.job_id);
  request.set_attempt(options_.attempt);
  *request.mutable_metrics() = metrics;
  v1::ReportMetricsResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
  Status status = daemon::from_grpc_status(stub_->ReportMetrics(&context, request, &response),
                                           "Coordinator.ReportMetrics", options_.coordinator);
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

}  // namespace cohort::worker
