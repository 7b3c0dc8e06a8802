#pragma once

// A training program's progress to the coordinator (Coordinator.ReportMetrics), so `cohort status`,
// the CLI's progress bar, job watchers and the metrics history see step, loss, accuracy and
// throughput while a job runs. Shared by cohort-worker (worker/runner) and the user-facing
// cohort::report_metrics (worker/train/report_metrics.h). No libtorch here.
//
//   auto reporter = MetricsReporter::from_environment();   // null without COHORT_COORDINATOR
//   if (reporter) reporter->report(metrics, /*epoch_end=*/false);
//
// Sending happens on a background thread so training never waits on the network: report()
// queues and returns. Reports are rate-limited (at most one every min_interval, the newest one
// wins) except those that close an epoch, which are always queued (up to kMetricsQueueLimit).
// Failed RPCs (coordinator gone, deadline) are logged once and dropped: metrics are advisory and
// never fail a job. flush() sends what is held within a deadline; the destructor sends what is
// still queued, each within the RPC deadline (none after a failure), then stops the thread.
//
// Who may report: the coordinator accepts a report from any process that holds the attempt's
// secret (COHORT_JOB_SECRET) and keeps the newest one per job, so reports from several ranks
// would overwrite each other; by convention only rank 0 reports.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "worker/base/leader_channel.h"

namespace cohort::train {

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

class MetricsReporter {
 public:
  // Starts the sending thread; connects lazily (the first RPC) over TLS with the attempt's secret
  // (COHORT_CA_CERTIFICATE, COHORT_JOB_SECRET; plaintext without a CA: a development coordinator).
  explicit MetricsReporter(MetricsReporterOptions options);
  ~MetricsReporter();
  MetricsReporter(const MetricsReporter&) = delete;
  MetricsReporter& operator=(const MetricsReporter&) = delete;

  // From COHORT_COORDINATOR, COHORT_JOB_ID and COHORT_ATTEMPT (default 1); null when the first two
  // are not both set (a program started by hand reports nowhere).
  static std::unique_ptr<MetricsReporter> from_environment();

  // Queues `metrics` (see the rate limit above) and returns at once. Thread-safe.
  void report(const v1::Metrics& metrics, bool epoch_end);

  // Sends every held report now (the rate limit is waived) and waits until they went out or
  // `timeout` passed. True when nothing is left unsent (failed sends count as gone). Thread-safe;
  // blocks the caller only, never report().
  bool flush(std::chrono::milliseconds timeout);

  // Reports sent successfully and failed so far (for tests and logs). Thread-safe.
  int64_t sent() const;
  int64_t failed() const;

 private:
  void send_loop();
  void send(const v1::Metrics& metrics);
  bool idle_locked() const { return queue_.empty() && !latest_.has_value() && !in_flight_; }

  MetricsReporterOptions options_;
  std::unique_ptr<tls::LeaderChannel> leader_;  // the coordinator(s); calls follow the leader
  mutable std::mutex mutex_;
  std::condition_variable wake_;  // the sending thread: work, a flush or stopping
  std::condition_variable idle_;  // flush(): a send finished or the thread stopped
  std::deque<v1::Metrics> queue_;                          // epoch ends, in order
  std::optional<v1::Metrics> latest_;                      // the newest rate-limited report not yet sent
  std::chrono::steady_clock::time_point last_accepted_{};  // the last mid-epoch report's send
  int flush_waiters_ = 0;                                  // flush() calls waiting: no rate limit
  bool in_flight_ = false;                                 // a ReportMetrics call is under way
  bool stopping_ = false;
  bool stopped_ = false;                                   // the sending thread has returned
  bool warned_ = false;
  int64_t sent_ = 0;
  int64_t failed_ = 0;
  std::thread thread_;
};

// Metric names report_metrics understands, mapped onto v1::Metrics' fields: "loss", "accuracy",
// "samples_per_s", "epoch", "total_steps", "total_epochs", "samples_per_step", "comm_wait_s",
// "comm_wait_ratio".
std::vector<std::string> known_metric_names();

// `values` as v1::Metrics at `step` from `rank`. Names not in known_metric_names() are left out
// and appended to `unknown` (when not null). Non-blocking.
v1::Metrics metrics_from_values(const std::vector<std::pair<std::string, double>>& values, int64_t step,
                                int rank, std::vector<std::string>* unknown);

// Test seam of cohort::report_metrics (worker/train/report_metrics.h): forgets the process-wide
// reporter (sending what it holds first) so the next call reads the environment again.
void reset_report_metrics_for_testing();

}  // namespace cohort::train
