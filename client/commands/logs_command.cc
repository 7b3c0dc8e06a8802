// cohort logs JOB [--rank R] [-f]

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "client/cli/args.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

// With -f, how often to look again for a job that is not placed or launched yet.
constexpr auto kLogsRetryInterval = std::chrono::milliseconds(500);

constexpr const char* kHelp = R"(usage: cohort logs JOB [--rank R] [-f]

Prints a rank's output (stdout and stderr interleaved), read from the agent of the node the rank
runs on.

  --rank R, -r R  the rank (default 0)
  --follow, -f    keep printing new output until the rank exits (waits for a queued job to start)

  -o json prints one {"job_id", "rank", "text"} object per chunk, one per line.

examples:
  cohort logs mnist-1
  cohort logs mnist-1 --rank 3 -f
)";

int run(const CommandContext& context, const std::vector<std::string>& raw_args) {
  StatusOr<Args> args = Args::parse(raw_args, {{"--rank", "-r", true}, {"--follow", "-f", false}});
  if (!args.ok()) return usage_error(context, "logs", args.status().message());
  if (args->positional().size() != 1) return usage_error(context, "logs", "give one job id: cohort logs JOB");
  StatusOr<int> rank = args->int_value("--rank", 0, 0, 1 << 20);
  if (!rank.ok()) return usage_error(context, "logs", rank.status().message());
  const std::string& job_id = args->positional()[0];
  const bool follow = args->has("--follow");
  Client client(context.coordinator, context.client_options);
  // -o json: a character split across chunks is held back to the next one, so each object's text
  // is whole UTF-8.
  std::string held;
  auto print_json = [&](const std::string& text) {
    *context.out << fmt::format("{{\"job_id\": {}, \"rank\": {}, \"text\": {}}}\n", json_quote(job_id), *rank,
                                json_quote(text));
  };
  auto print = [&](std::string_view bytes) {
    if (context.format == OutputFormat::kJson) {
      held.append(bytes);
      const size_t complete = utf8_complete_prefix(held);
      if (complete > 0) print_json(held.substr(0, complete));
      held.erase(0, complete);
    } else {
      context.out->write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    context.out->flush();
    return true;
  };
  // The agent keeps only the newest output in memory: say what is missing and where it is.
  auto gap = [&](int64_t skipped, const std::string& log_path, const std::string& node_id) {
    *context.err << fmt::format("[{} bytes skipped; the full log is {} on node {}]\n", skipped,
                                log_path.empty() ? "the rank's log file" : log_path, node_id);
    context.err->flush();
  };
  while (true) {
    Status status = client.logs(job_id, *rank, follow, print, std::nullopt, gap);
    if (!held.empty()) {  // the output ended inside a character: json_quote marks the bytes invalid
      print_json(held);
      held.clear();
      context.out->flush();
    }
    // Following a job that is queued (no placement) or whose tasks are still being launched (the
    // agent does not know it yet): wait for it, unless it ended without ever running.
    const bool not_there_yet =
        status.code() == StatusCode::kFailedPrecondition || status.code() == StatusCode::kNotFound;
    if (status.ok() || !follow || !not_there_yet)
      return status.ok() ? kExitOk : report_error(context, status);
    StatusOr<cohort::v1::JobRecord> job = client.get(job_id);
    if (!job.ok()) return report_error(context, job.status());
    if (is_final_state(job->state())) {
      // It ended between the two calls: say so rather than the stale "not placed yet".
      if (job->placement().nodes_size() == 0) {
        return report_error(context, failed_precondition_error("job {} ended ({}) without running, so it "
                                                               "has no logs",
                                                               job_id, state_name(job->state())));
      }
      return report_error(context, status);
    }
    std::this_thread::sleep_for(kLogsRetryInterval);
  }
}

}  // namespace

const Command kLogsCommand = {"logs", "print a rank's output (-f to follow)", kHelp, run};

}  // namespace cohort::client::commands
