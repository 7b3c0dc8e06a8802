// cohort metrics JOB [--attempt A] [-f] [-o json|csv]

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "client/cli/args.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kHelp = R"(usage: cohort metrics JOB [--attempt A] [-f]

Prints a job's metrics history: every progress report its workers sent (step, epoch, loss,
accuracy, samples/s), oldest first, as the coordinator stored it. The history survives coordinator
restarts; a very long job's history is thinned (every second point dropped, the first and newest
kept) once it holds 10000 points.

  --attempt A, -a A  only that attempt's reports (default: every attempt)
  --follow, -f       after the history, print new reports as they arrive until the job ends

  -o json  one JSON object per report and line: seq, attempt, unix_ms, step, epoch, loss,
           accuracy, samples_per_s, rank
  -o csv   the same columns, with a header line

examples:
  cohort metrics mnist-1
  cohort metrics mnist-1 -f
  cohort metrics mnist-1 -o csv > mnist-1.csv
)";

// One report, with what every format prints.
struct Row {
  int64_t seq = 0;
  int attempt = 0;
  int64_t unix_ms = 0;
  cohort::v1::Metrics metrics;
};

int64_t unix_ms_of(const google::protobuf::Timestamp& time) { return time.seconds() * 1000 + time.nanos() / 1000000; }

// JSON has no NaN or infinity (a diverged loss): those print as null.
std::string json_number(double value) { return std::isfinite(value) ? fmt::format("{}", value) : "null"; }

class RowPrinter {
 public:
  explicit RowPrinter(const CommandContext& context) : context_(context) {}

  void print(const Row& row) {
    const cohort::v1::Metrics& m = row.metrics;
    std::ostream& out = *context_.out;
    switch (context_.format) {
      case OutputFormat::kJson:
        out << fmt::format(
            "{{\"seq\": {}, \"attempt\": {}, \"unix_ms\": {}, \"step\": {}, \"epoch\": {}, \"loss\": {}, "
            "\"accuracy\": {}, \"samples_per_s\": {}, \"rank\": {}}}\n",
            row.seq, row.attempt, row.unix_ms, m.step(), m.epoch(), json_number(m.loss()),
            json_number(m.accuracy()), json_number(m.samples_per_s()), m.rank());
        break;
      case OutputFormat::kCsv:
        if (!header_done_) out << "seq,attempt,unix_ms,step,epoch,loss,accuracy,samples_per_s,rank\n";
        out << fmt::format("{},{},{},{},{},{},{},{},{}\n", row.seq, row.attempt, row.unix_ms, m.step(), m.epoch(),
                           m.loss(), m.accuracy(), m.samples_per_s(), m.rank());
        break;
      default: {
        if (!header_done_) {
          out << fmt::format("{:<20} {:>7} {:>10} {:>5} {:>12} {:>9} {:>12}\n", "TIME", "ATTEMPT", "STEP", "EPOCH",
                             "LOSS", "ACCURACY", "SAMPLES/S");
        }
        google::protobuf::Timestamp time;
        time.set_seconds(row.unix_ms / 1000);
        out << fmt::format("{:<20} {:>7} {:>10} {:>5} {:>12.6g} {:>9.4f} {:>12.1f}\n", format_time(time),
                           row.attempt, m.step(), m.epoch(), m.loss(), m.accuracy(), m.samples_per_s());
        break;
      }
    }
    header_done_ = true;
    out.flush();
  }

 private:
  const CommandContext& context_;
  bool header_done_ = false;
};

int run(const CommandContext& context, const std::vector<std::string>& raw_args) {
  StatusOr<Args> args = Args::parse(raw_args, {{"--attempt", "-a", true}, {"--follow", "-f", false}});
  if (!args.ok()) return usage_error(context, "metrics", args.status().message());
  if (args->positional().size() != 1)
    return usage_error(context, "metrics", "give one job id: cohort metrics JOB");
  StatusOr<int> attempt = args->int_value("--attempt", 0, 0, 1 << 20);
  if (!attempt.ok()) return usage_error(context, "metrics", attempt.status().message());
  const std::string& job_id = args->positional()[0];
  Client client(context.coordinator, context.client_options);

  RowPrinter printer(context);
  StatusOr<std::vector<cohort::v1::MetricsPoint>> history = client.metrics(job_id, 0, *attempt);
  if (!history.ok()) return report_error(context, history.status());
  int64_t last_seq = 0;
  for (const cohort::v1::MetricsPoint& point : *history) {
    printer.print(Row{point.seq(), point.attempt(), unix_ms_of(point.time()), point.metrics()});
    last_seq = point.seq();
  }
  if (!args->has("--follow")) {
    if (history->empty() && context.format == OutputFormat::kHuman)
      *context.err << fmt::format("job {} has no metrics reports (yet)\n", job_id);
    return kExitOk;
  }

  // Follow: the coordinator publishes each report as a WatchJob event with the seq it stores it
  // under, so watching after the last stored seq continues the series without a gap or repeat.
  StatusOr<cohort::v1::JobRecord> job = client.get(job_id);
  if (!job.ok()) return report_error(context, job.status());
  int current_attempt = job->attempt();
  Status watched = client.watch(
      job_id,
      [&](const cohort::v1::JobEvent& event) {
        if (event.has_state_change()) {
          current_attempt = event.state_change().attempt();
        } else if (event.has_metrics() && event.seq() > last_seq &&
                   (*attempt == 0 || *attempt == current_attempt)) {
          printer.print(Row{event.seq(), current_attempt, unix_ms_of(event.time()), event.metrics()});
          last_seq = event.seq();
        }
        return true;
      },
      last_seq);
  return watched.ok() ? kExitOk : report_error(context, watched);
}

}  // namespace

const Command kMetricsCommand = {"metrics", "print a job's metrics history (-f to follow)", kHelp, run};

}  // namespace cohort::client::commands
