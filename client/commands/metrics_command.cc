// cohort metrics JOB [--attempt A] [-f] [-o json|csv]

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription =
    "Prints a job's metrics history: every progress report its workers sent (step, epoch, loss,\n"
    "accuracy, samples/s), oldest first, as the coordinator stored it. The history survives coordinator\n"
    "restarts; a very long job's history is thinned (every second point dropped, the first and newest\n"
    "kept) once it holds 10000 points. -o json prints one JSON object per report and line (seq, attempt,\n"
    "unix_ms, step, epoch, loss, accuracy, samples_per_s, rank); -o csv the same columns with a header.";

constexpr const char* kFooter = R"(examples:
  cohort metrics mnist-1
  cohort metrics mnist-1 -f
  cohort metrics mnist-1 -o csv > mnist-1.csv
)";

// The highest attempt number --attempt accepts.
constexpr int kMaxAttemptFlag = 1 << 20;

struct Options {
  std::string job_id;
  int attempt = 0;  // 0: every attempt
  bool follow = false;
};

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

int run(const CommandContext& context, const Options& options) {
  const std::string& job_id = options.job_id;
  Client client(context.coordinator, context.client_options);

  RowPrinter printer(context);
  StatusOr<std::vector<cohort::v1::MetricsPoint>> history = client.metrics(job_id, 0, options.attempt);
  if (!history.ok()) return report_error(context, history.status());
  int64_t last_seq = 0;
  for (const cohort::v1::MetricsPoint& point : *history) {
    printer.print(Row{point.seq(), point.attempt(), unix_ms_of(point.time()), point.metrics()});
    last_seq = point.seq();
  }
  if (!options.follow) {
    if (history->empty() && context.human())
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
                   (options.attempt == 0 || options.attempt == current_attempt)) {
          printer.print(Row{event.seq(), current_attempt, unix_ms_of(event.time()), event.metrics()});
          last_seq = event.seq();
        }
        return true;
      },
      last_seq);
  return watched.ok() ? kExitOk : report_error(context, watched);
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  auto options = std::make_shared<Options>();
  app->add_option("JOB", options->job_id, "the job's id")->required();
  app->add_option("-a,--attempt", options->attempt, "only that attempt's reports (default: every attempt)")
      ->type_name("A")
      ->check(CLI::Range(0, kMaxAttemptFlag));
  app->add_flag("-f,--follow", options->follow,
                "after the history, print new reports as they arrive until the job ends");
  return [options](const CommandContext& context) { return run(context, *options); };
}

}  // namespace

const Command kMetricsCommand = {"metrics", "print a job's metrics history (-f to follow)", define};

}  // namespace cohort::client::commands
