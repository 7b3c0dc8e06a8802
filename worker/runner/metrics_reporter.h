#pragma once

// cohort-worker's MetricsSink (worker/runner/job_runner.h) over the library's reporter
// (worker/train/metrics_reporter.h): rank 0's training progress to the coordinator
// (Coordinator.ReportMetrics), so `cohort status` and job watchers see step, loss, accuracy and
// throughput while a job runs. Rate limit, queue, flush and failure handling are the library's.
//
//   auto reporter = MetricsReporter::from_environment();   // null without COHORT_COORDINATOR
//   options.metrics = reporter.get();
//   run_job(spec, *comm, options);                          // reporter->report(...) from training

#include <memory>

#include "worker/runner/job_runner.h"
#include "worker/train/metrics_reporter.h"

namespace cohort::worker {

class MetricsReporter : public MetricsSink {
 public:
  explicit MetricsReporter(std::unique_ptr<train::MetricsReporter> reporter) : reporter_(std::move(reporter)) {}

  // From COHORT_COORDINATOR, COHORT_JOB_ID and COHORT_ATTEMPT; null when the first two are not both
  // set (a worker started by hand reports nowhere).
  static std::unique_ptr<MetricsReporter> from_environment() {
    std::unique_ptr<train::MetricsReporter> reporter = train::MetricsReporter::from_environment();
    if (reporter == nullptr) return nullptr;
    return std::make_unique<MetricsReporter>(std::move(reporter));
  }

  // Queues and returns at once (train::MetricsReporter::report). Thread-safe.
  void report(const v1::Metrics& metrics, bool epoch_end) override { reporter_->report(metrics, epoch_end); }

 private:
  std::unique_ptr<train::MetricsReporter> reporter_;
};

}  // namespace cohort::worker
