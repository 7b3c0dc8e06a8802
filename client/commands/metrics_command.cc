// cohort metrics JOB [--attempt A] [-f] [-o json|csv]

#include <string>

#include <fmt/format.h>

#include "client/cli/metrics_printer.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription =
    "Prints a job's metrics history: every progress report its workers sent (step, epoch, loss,\n"
    "accuracy, samples/s, communication wait), oldest first, as the coordinator stored it. The history\n"
    "survives coordinator restarts; a very long job's history is thinned (every second point dropped, the\n"
    "first and newest kept) once it holds 10000 points. COMM WAIT is the reporting rank's time blocked in\n"
    "collectives this attempt, and the share of wall time since its previous report. -o json prints one\n"
    "JSON object per report and line (seq, attempt, unix_ms, step, epoch, loss, accuracy, samples_per_s,\n"
    "rank, comm_wait_s, comm_wait_ratio); -o csv the same columns with a header.";

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

int run(const CommandContext& context, const Options& options) {
  const std::string& job_id = options.job_id;
  Client client(context.coordinator, context.client_options);

  MetricsPrinter printer(context);
  StatusOr<std::vector<cohort::v1::MetricsPoint>> history = client.metrics(job_id, 0, options.attempt);
  if (!history.ok()) return report_error(context, history.status());
  int64_t last_seq = 0;
  for (const cohort::v1::MetricsPoint& point : *history) {
    printer.print(MetricsRow::of(point));
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
          printer.print(MetricsRow::of(event, current_attempt));
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
