#pragma once

// Metrics from your own training program to cohortd, so they show in `cohort status`, the CLI's
// progress bar (`cohort submit --wait`, `cohort run`), the dashboard and the job's metrics
// history, as cohort-worker's own do:
//
//   #include "worker/train/report_metrics.h"
//   for (int64_t step = 1; step <= steps; ++step) {
//     ...
//     cohort::report_metrics({{"loss", loss}}, step);
//   }
//   cohort::report_metrics({{"loss", loss}, {"accuracy", test_accuracy}, {"epoch", epoch}}, step,
//                          /*epoch_end=*/true);
//   cohort::flush_metrics();  // optional: also done at exit
//
// Names understood (the fields of cohort.v1.Metrics): "loss", "accuracy" (in [0, 1]),
// "samples_per_s", "epoch" (0-based), "total_steps", "total_epochs", "samples_per_step" (these
// three let the CLI show an ETA), "comm_wait_s" (seconds blocked in collectives so far, e.g.
// Communicator::blocked_time()) and "comm_wait_ratio" (its share of recent wall time; both are
// on the coordinator's /metrics). Any other name is ignored with one warning naming it.
//
// - Never blocks training: a call copies the values into a bounded queue and returns; a background
//   thread sends them (Coordinator.ReportMetrics, each call with a 2 s deadline). Reports are
//   rate-limited to two a second, the newest one wins; epoch_end reports are never dropped by the
//   rate limit (64 are kept while the coordinator is slow). A failed send is logged once and
//   training goes on.
// - Only rank 0 reports: the coordinator keeps the newest report of a job from any of its ranks
//   (it checks the attempt's secret, not the rank), so every rank's numbers would overwrite each
//   other. Calls on a rank whose RANK is not 0 do nothing, so every rank may call it.
// - Outside cohortd (no COHORT_COORDINATOR / COHORT_JOB_ID, e.g. run by hand, torchrun, srun) it
//   does nothing, after one informational log line.
// - What cohortd's agent gives every rank is all it needs: COHORT_COORDINATOR, COHORT_JOB_ID,
//   COHORT_ATTEMPT, COHORT_JOB_SECRET and COHORT_CA_CERTIFICATE (TLS to the coordinator), RANK.
// - Held reports are sent at normal exit (std::exit / return from main), within
//   kExitFlushTimeout; call flush_metrics() yourself before _exit, an abort or a signal.
//
// All functions are thread-safe. No libtorch, no gRPC or protobuf types in this header.

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cohort {

// How long flush_metrics() waits by default, and the flush at exit.
inline constexpr std::chrono::milliseconds kDefaultMetricsFlushTimeout{5000};
inline constexpr std::chrono::milliseconds kExitFlushTimeout{3000};

// Reports `values` at optimizer step `step` (see above). Non-blocking.
void report_metrics(const std::vector<std::pair<std::string, double>>& values, int64_t step,
                    bool epoch_end = false);

// Sends every held report now and waits until they went out or `timeout` passed. True when
// nothing is left unsent (also when reporting is off on this rank). Blocks the caller only.
bool flush_metrics(std::chrono::milliseconds timeout = kDefaultMetricsFlushTimeout);

// Whether this process reports (rank 0 of a job started by cohortd). Decided on the first call of
// any function here, from the environment; later changes to it are not seen.
bool metrics_reporting_enabled();

}  // namespace cohort
