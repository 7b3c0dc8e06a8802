// cohort wait JOB [--timeout SECONDS]

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "client/cli/job_follower.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription =
    "Waits quietly until a job ends, prints its final state (-o json / -o yaml: its record) and exits\n"
    "with its result: 0 SUCCEEDED, 3 FAILED or CANCELLED, 1 when the wait itself failed (the timeout\n"
    "passed, or the coordinator stayed unreachable for a minute).";

constexpr const char* kFooter = R"(examples:
  cohort wait mnist-1 && echo done
  id=$(cohort submit job.yaml -o json | jq -r .job_id); cohort wait "$id" --timeout 3600
)";

// The longest --timeout (a week, in seconds).
constexpr int kMaxWaitSeconds = 7 * 24 * 3600;

struct Options {
  std::string job_id;
  int timeout_s = 0;  // 0: no limit
};

int run(const CommandContext& context, const Options& options) {
  Client client(context.coordinator, context.client_options);
  const auto start = std::chrono::steady_clock::now();
  const auto limit = std::chrono::seconds(options.timeout_s);
  auto backoff = kFollowInitialRetryBackoff;
  auto unreachable_since = std::chrono::steady_clock::time_point();
  for (;;) {
    StatusOr<cohort::v1::JobRecord> job = client.get(options.job_id);
    Status error = job.ok() ? ok_status() : job.status();
    if (job.ok() && is_final_state(job->state())) {
      if (context.structured()) {
        print_structured(context, to_json(*job));
      } else {
        *context.out << "job " << job->id() << ": " << state_name(job->state())
                     << (job->reason().empty() ? "" : " (" + job->reason() + ")") << '\n';
      }
      return job->state() == cohort::v1::SUCCEEDED ? kExitOk : kExitJobFailed;
    }
    if (job.ok()) {
      StreamTimeout timeout;
      if (options.timeout_s > 0) {
        const auto left = limit - (std::chrono::steady_clock::now() - start);
        if (left <= std::chrono::milliseconds(0)) {
          return report_error(context, deadline_exceeded_error("job {} did not end within {}s; it is {}", job->id(),
                                                               options.timeout_s, state_name(job->state())));
        }
        timeout = std::chrono::duration_cast<std::chrono::milliseconds>(left);
      }
      // Returns when the job reaches a final state; then the record is read again above.
      error = client.watch(options.job_id, [](const cohort::v1::JobEvent&) { return true; }, 0, timeout);
      if (error.ok()) continue;
      if (error.code() == StatusCode::kDeadlineExceeded && options.timeout_s > 0) continue;
    }
    if (error.code() != StatusCode::kUnavailable && error.code() != StatusCode::kDeadlineExceeded)
      return report_error(context, error);
    // A coordinator restarting: try again with backoff, for up to kFollowReconnectWindow.
    const auto now = std::chrono::steady_clock::now();
    if (unreachable_since == std::chrono::steady_clock::time_point()) unreachable_since = now;
    if (now - unreachable_since > kFollowReconnectWindow) return report_error(context, error);
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::duration_cast<std::chrono::milliseconds>(kFollowMaxRetryBackoff));
  }
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  auto options = std::make_shared<Options>();
  app->add_option("JOB", options->job_id, "the job's id")->required();
  app->add_option("--timeout", options->timeout_s, "give up after this many seconds (exit 1); default: no limit")
      ->type_name("SECONDS")
      ->check(CLI::Range(1, kMaxWaitSeconds));
  return [options](const CommandContext& context) { return run(context, *options); };
}

}  // namespace

const Command kWaitCommand = {"wait", "wait for a job to end; exit 0 if it SUCCEEDED, 3 if not", define};

}  // namespace cohort::client::commands
