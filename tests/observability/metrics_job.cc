// A command job for the dashboard test: reports a falling loss, a rising accuracy and a throughput
// with cohort::report_metrics every --interval-ms for --steps steps (printing each step, so the
// rank's log has lines to show), then flushes and exits 0.
//
//   metrics_job --steps 24 --interval-ms 500

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "worker/train/report_metrics.h"

namespace {

// Reports are rate-limited to two a second (report_metrics.h): at this interval none is dropped.
constexpr int kDefaultIntervalMs = 600;
constexpr int kDefaultSteps = 20;

int flag_value(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = flag_value(argc, argv, "--steps", kDefaultSteps);
  const int interval_ms = flag_value(argc, argv, "--interval-ms", kDefaultIntervalMs);
  if (steps < 1 || interval_ms < 1) {
    std::fprintf(stderr, "metrics_job: --steps and --interval-ms must be positive\n");
    return 2;
  }
  for (int step = 1; step <= steps; ++step) {
    const double loss = 2.0 / (1.0 + 0.3 * step);
    const double accuracy = 1.0 - loss / 2.0;
    const double samples_per_s = 1000.0 + 10.0 * step;
    std::printf("dashboard-test step %d loss %.4f accuracy %.4f\n", step, loss, accuracy);
    std::fflush(stdout);
    cohort::report_metrics({{"loss", loss},
                            {"accuracy", accuracy},
                            {"samples_per_s", samples_per_s},
                            {"total_steps", static_cast<double>(steps)}},
                           step);
    std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
  }
  if (!cohort::flush_metrics()) {
    std::fprintf(stderr, "metrics_job: reports still unsent after the flush\n");
    return 1;
  }
  std::printf("dashboard-test done\n");
  return 0;
}
