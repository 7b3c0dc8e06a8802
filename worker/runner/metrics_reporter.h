#pragma once

// Rank 0's training progress to the coordinator (Coordinator.ReportMetrics), so `cohort status`
// and job watchers see step, loss, accuracy and throughput while a job runs.
//
//   auto reporter = MetricsReporter::from_environment();   // null without COHORT_COORDINATOR
//   options.metrics = reporter.get();
//   run_job(spec, *comm, options);                          // reporter->report(...) from training
//
// Sending happens on a background thread so training never waits on the network: report()
// queues and returns. Reports are rate-limited (at most one every min_interval, the newest one
// wins) except those that close an epoch, which are always queued. Failed RPCs (coordinator gone,
// deadline) are logged once and dropped: metrics are advisory and never fail a job. The
// destructor sends what is still queued, each within the RPC deadline, then stops the thread.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "worker/runner/job_runner.h"

namespace cohort::worker {

// Every ReportMetrics call's deadline: metrics are not worth waiting for.
inline constexpr std::chrono::milliseconds kDefaultMetricsRpcTimeout{2000};
// At most two reports a second between epoch ends.
inline constexpr std::chrono::milliseconds kDefaultMetricsMinInterval{500};
// Queued epoch-end reports kept while the coordinator is slow; the oldest are dropped beyond.
inline constexpr size_t kMetricsQueueLimit = 64;

struct MetricsReporterOptions {
  std::string coordinator;  // host:port of the coordinator's gRPC server
  std::string job_id;       // ReportMetricsRequest.job_id
  int attempt = 1;          // ReportMetricsRequest.attempt
  std::chrono::milliseconds rpc_timeout = kDefaultMetricsRpcTimeout;    // per call
  std::chrono::milliseconds min_interval = kDefaultMetricsMinInterval;  // between non-epoch-end reports
};

class MetricsReporter : public MetricsSink {
 public:
  // Starts the sending thread; connects lazily (the first RPC). Local.
  explicit MetricsReporter(MetricsReporterOptions options);
  ~MetricsReporter() override;
  MetricsReporter(const MetricsReporter&) = delete;
  MetricsReporter& operator=(const MetricsReporter&) = delete;

  // From COHORT_COORDINATOR, COHORT_JOB_ID and COHORT_ATTEMPT (default 1); null when the first two
  // are not both set (a worker started by hand reports nowhere).
  static std::unique_ptr<MetricsReporter> from_environment();

  // Queues `metrics` (see the rate limit above) and returns at once. Thread-safe.
  void report(const v1::Metrics& metrics, bool epoch_end) override;

  // Reports sent successfully and failed so far (for tests and logs). Thread-safe.
  int64_t sent() const;
  int64_t failed() const;

 private:
  void send_loop();
  void send(const v1::Metrics& metrics);

  MetricsReporterOptions options_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<v1::Metrics> queue_;                          // epoch ends, in order
  std::optional<v1::Metrics> latest_;                      // the newest rate-limited report not yet sent
  std::chrono::steady_clock::time_point last_accepted_{};  // the last mid-epoch report's send
  bool stopping_ = false;
  bool warned_ = false;
  int64_t sent_ = 0;
  int64_t failed_ = 0;
  std::thread thread_;
};

}  // namespace cohort::worker
