#include "worker/train/report_metrics.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "worker/train/metrics_reporter.h"

namespace cohort {
namespace {

// The process's reporter, made on the first call from the environment. Not a static object: it is
// flushed and deleted by an atexit handler registered after gRPC's own statics exist, so it never
// runs after them.
struct ProcessMetrics {
  std::mutex mutex;
  bool initialized = false;
  int rank = 0;
  // null: reporting is off in this process. Shared: flush_metrics() flushes outside the lock on
  // its own reference, so the exit handler or a test's reset dropping this one cannot free the
  // reporter under it; the last holder deletes it.
  std::shared_ptr<train::MetricsReporter> reporter;
  std::set<std::string> warned_names;  // unknown names already warned about
};

ProcessMetrics& process_metrics() {
  static ProcessMetrics* state = new ProcessMetrics();  // never destroyed: used from atexit
  return *state;
}

void flush_and_stop_at_exit() {
  ProcessMetrics& state = process_metrics();
  std::shared_ptr<train::MetricsReporter> reporter;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    reporter = std::move(state.reporter);
    state.reporter = nullptr;
  }
  if (reporter == nullptr) return;
  if (!reporter->flush(kExitFlushTimeout)) {
    spdlog::warn("cohort::report_metrics: some metrics were not sent within {} ms at exit",
                 kExitFlushTimeout.count());
  }
  // Dropping the reference stops the sending thread (nothing is left to send, or sending failed),
  // unless a flush_metrics() still holds one: then that call's end deletes it.
}

// Decides, once, whether this process reports. Called with state.mutex held.
void initialize_locked(ProcessMetrics& state) {
  if (state.initialized) return;
  state.initialized = true;
  const char* rank = std::getenv("RANK");
  state.rank = rank != nullptr && *rank != '\0' ? std::atoi(rank) : 0;
  std::unique_ptr<train::MetricsReporter> reporter = train::MetricsReporter::from_environment();
  if (reporter == nullptr) {
    spdlog::info(
        "cohort::report_metrics: this program was not started by cohortd (COHORT_COORDINATOR or COHORT_JOB_ID "
        "is unset), so its metrics are not reported anywhere");
    return;
  }
  if (state.rank != 0) return;  // rank 0 reports for the job (see the header)
  state.reporter = std::move(reporter);
  static std::once_flag registered;
  std::call_once(registered, [] { std::atexit(flush_and_stop_at_exit); });
}

}  // namespace

void report_metrics(const std::vector<std::pair<std::string, double>>& values, int64_t step, bool epoch_end) {
  ProcessMetrics& state = process_metrics();
  std::lock_guard<std::mutex> lock(state.mutex);
  initialize_locked(state);
  if (state.reporter == nullptr) return;
  std::vector<std::string> unknown;
  v1::Metrics metrics = train::metrics_from_values(values, step, state.rank, &unknown);
  for (const std::string& name : unknown) {
    if (!state.warned_names.insert(name).second) continue;
    spdlog::warn("cohort::report_metrics: unknown metric '{}' is not reported; the names understood are {}", name,
                 fmt::join(train::known_metric_names(), ", "));
  }
  state.reporter->report(metrics, epoch_end);
}

bool flush_metrics(std::chrono::milliseconds timeout) {
  ProcessMetrics& state = process_metrics();
  std::shared_ptr<train::MetricsReporter> reporter;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    initialize_locked(state);
    reporter = state.reporter;
  }
  // Not under the lock: report() from other threads must not wait for the network. The copied
  // reference keeps the reporter alive while the exit handler or a test's reset drops theirs.
  return reporter == nullptr || reporter->flush(timeout);
}

bool metrics_reporting_enabled() {
  ProcessMetrics& state = process_metrics();
  std::lock_guard<std::mutex> lock(state.mutex);
  initialize_locked(state);
  return state.reporter != nullptr;
}

namespace train {

void reset_report_metrics_for_testing() {
  ProcessMetrics& state = process_metrics();
  std::shared_ptr<train::MetricsReporter> reporter;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    reporter = std::move(state.reporter);
    state.reporter = nullptr;
    state.initialized = false;
    state.warned_names.clear();
  }
  // Dropped outside the lock: the reporter's destructor joins its sending thread.
}

}  // namespace train
}  // namespace cohort
