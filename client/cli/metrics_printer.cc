#include "client/cli/metrics_printer.h"

#include <cmath>
#include <ostream>
#include <string>

#include <fmt/format.h>

#include "client/cli/output.h"

namespace cohort::client::cli {
namespace {

int64_t unix_ms_of(const google::protobuf::Timestamp& time) { return time.seconds() * 1000 + time.nanos() / 1000000; }

// JSON has no NaN or infinity (a diverged loss): those print as null.
std::string json_number(double value) { return std::isfinite(value) ? fmt::format("{}", value) : "null"; }

// The table's communication wait: cumulative seconds and the share of wall time since the previous
// report ("12.5s 25%"); "-" when the worker did not measure it (older workers, or no collectives).
std::string comm_wait_cell(const cohort::v1::Metrics& m) {
  if (m.comm_wait_s() <= 0 && m.comm_wait_ratio() <= 0) return "-";
  return fmt::format("{:.1f}s {:.0f}%", m.comm_wait_s(), 100 * m.comm_wait_ratio());
}

}  // namespace

MetricsRow MetricsRow::of(const cohort::v1::MetricsPoint& point) {
  return MetricsRow{point.seq(), point.attempt(), unix_ms_of(point.time()), point.metrics()};
}

MetricsRow MetricsRow::of(const cohort::v1::JobEvent& event, int attempt) {
  return MetricsRow{event.seq(), attempt, unix_ms_of(event.time()), event.metrics()};
}

void MetricsPrinter::print(const MetricsRow& row) {
  const cohort::v1::Metrics& m = row.metrics;
  std::ostream& out = *context_.out;
  switch (context_.format) {
    case OutputFormat::kJson:
      out << fmt::format(
          "{{\"seq\": {}, \"attempt\": {}, \"unix_ms\": {}, \"step\": {}, \"epoch\": {}, \"loss\": {}, "
          "\"accuracy\": {}, \"samples_per_s\": {}, \"rank\": {}, \"comm_wait_s\": {}, \"comm_wait_ratio\": {}}}\n",
          row.seq, row.attempt, row.unix_ms, m.step(), m.epoch(), json_number(m.loss()), json_number(m.accuracy()),
          json_number(m.samples_per_s()), m.rank(), json_number(m.comm_wait_s()), json_number(m.comm_wait_ratio()));
      break;
    case OutputFormat::kCsv:
      // New columns go at the end, so a script that reads the older ones by position keeps working.
      if (!header_done_) {
        out << "seq,attempt,unix_ms,step,epoch,loss,accuracy,samples_per_s,rank,comm_wait_s,comm_wait_ratio\n";
      }
      out << fmt::format("{},{},{},{},{},{},{},{},{},{},{}\n", row.seq, row.attempt, row.unix_ms, m.step(),
                         m.epoch(), m.loss(), m.accuracy(), m.samples_per_s(), m.rank(), m.comm_wait_s(),
                         m.comm_wait_ratio());
      break;
    default: {
      if (!header_done_) {
        out << fmt::format("{:<20} {:>7} {:>10} {:>5} {:>12} {:>9} {:>12} {:>12}\n", "TIME", "ATTEMPT", "STEP",
                           "EPOCH", "LOSS", "ACCURACY", "SAMPLES/S", "COMM WAIT");
      }
      google::protobuf::Timestamp time;
      time.set_seconds(row.unix_ms / 1000);
      out << fmt::format("{:<20} {:>7} {:>10} {:>5} {:>12.6g} {:>9.4f} {:>12.1f} {:>12}\n", format_time(time),
                         row.attempt, m.step(), m.epoch(), m.loss(), m.accuracy(), m.samples_per_s(),
                         comm_wait_cell(m));
      break;
    }
  }
  header_done_ = true;
  out.flush();
}

}  // namespace cohort::client::cli
