#pragma once

// MetricsPrinter: how `cohort metrics` prints a job's stored metrics reports, one call per report,
// in the context's format: an aligned table for people, one JSON object per line (-o json), or CSV
// with a header (-o csv). The history and the reports that follow it live (-f) go through one
// printer, so the header is printed once.
//
// Example:
//   MetricsPrinter printer(context);
//   for (const cohort::v1::MetricsPoint& point : history) printer.print(MetricsRow::of(point));

#include <cstdint>

#include "client/cli/command.h"
#include "cohort/v1/coordinator.pb.h"
#include "cohort/v1/job.pb.h"

namespace cohort::client::cli {

// One report, with what every format prints.
struct MetricsRow {
  int64_t seq = 0;      // the event seq that published it
  int attempt = 0;      // the attempt it belongs to
  int64_t unix_ms = 0;  // when the coordinator received it
  cohort::v1::Metrics metrics;

  // A stored report (GetMetrics).
  static MetricsRow of(const cohort::v1::MetricsPoint& point);
  // A report as WatchJob publishes it (event.metrics set), of `attempt` (the event does not say).
  static MetricsRow of(const cohort::v1::JobEvent& event, int attempt);
};

// Not thread-safe: one command's output. Writes to context.out and flushes after each row.
class MetricsPrinter {
 public:
  explicit MetricsPrinter(const CommandContext& context) : context_(context) {}

  void print(const MetricsRow& row);

 private:
  const CommandContext& context_;
  bool header_done_ = false;
};

}  // namespace cohort::client::cli
