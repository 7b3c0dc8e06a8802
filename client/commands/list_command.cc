// cohort list [--state STATE]... [--all] [--watch]

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <sstream>

#include <fmt/format.h>

#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription =
    "Lists your jobs in submission order as a table. -o wide adds the name, owner, start and end times\n"
    "and accuracy; -o json / -o yaml print {jobs: [...]} (cohort.v1.ListJobsResponse). With --watch the\n"
    "list is read again until Ctrl-C (exit 0) and printed again whenever it changed: redrawn in place on\n"
    "a terminal, appended otherwise (one JSON or YAML document per change).";

constexpr const char* kFooter = R"(examples:
  cohort list
  cohort list --state running --state pending
  cohort list --watch -o wide
  cohort list -o json | jq -r '.jobs[].id'
)";

// --watch reads the list again after this long; each unchanged read doubles the wait up to
// kWatchMaxInterval (a quiet cluster is not polled every second), a change resets it.
constexpr std::chrono::milliseconds kWatchInitialInterval{1000};
constexpr std::chrono::milliseconds kWatchMaxInterval{8000};
// How long --watch keeps retrying a coordinator that cannot be reached before it gives up (exit 1).
constexpr std::chrono::seconds kWatchReconnectWindow{60};

struct Options {
  std::vector<std::string> state_names;
  bool all = false;
  bool watch = false;
};

std::string progress_of(const cohort::v1::JobRecord& job, bool wide) {
  if (!job.has_last_metrics()) return "-";
  const cohort::v1::Metrics& m = job.last_metrics();
  std::string text = fmt::format("epoch {} step {} loss {:.4f}", m.epoch() + 1, m.step(), m.loss());
  if (wide && m.accuracy() > 0) text += fmt::format(" acc {:.2f}%", 100.0 * m.accuracy());
  return text;
}

// The jobs as the context's format prints them.
std::string render(const CommandContext& context, const std::vector<cohort::v1::JobRecord>& jobs) {
  if (context.structured()) {
    cohort::v1::ListJobsResponse response;
    for (const cohort::v1::JobRecord& job : jobs) *response.add_jobs() = job;
    const std::string json = to_json(response);
    return context.format == OutputFormat::kYaml ? json_to_yaml(json) : json;
  }
  if (jobs.empty()) return "no jobs\n";
  const bool wide = context.format == OutputFormat::kWide;
  std::vector<std::vector<std::string>> rows;
  for (const cohort::v1::JobRecord& job : jobs) {
    std::string nodes;
    for (const cohort::v1::NodeAssignment& node : job.placement().nodes())
      nodes += (nodes.empty() ? "" : ",") + node.node_id();
    const std::string reason =
        job.state() == cohort::v1::PENDING && !job.waiting_for().empty() ? job.waiting_for() : job.reason();
    const std::string shape = fmt::format("{}x{}{}", job.spec().nodes(), job.spec().procs_per_node(),
                                          wide && job.spec().gpus_per_proc() > 0
                                              ? fmt::format("x{}gpu", job.spec().gpus_per_proc())
                                              : "");
    if (wide) {
      rows.push_back({job.id(), job.spec().name(), job.owner().empty() ? "-" : job.owner(),
                      state_name(job.state()), std::to_string(job.attempt()), shape, nodes.empty() ? "-" : nodes,
                      format_time(job.submit_time()), format_time(job.start_time()), format_time(job.end_time()),
                      progress_of(job, true), reason});
    } else {
      rows.push_back({job.id(), state_name(job.state()), std::to_string(job.attempt()), shape,
                      nodes.empty() ? "-" : nodes, format_time(job.submit_time()), progress_of(job, false),
                      reason});
    }
  }
  std::ostringstream out;
  if (wide) {
    print_table(out, {"JOB", "NAME", "OWNER", "STATE", "ATTEMPT", "SHAPE", "NODES", "SUBMITTED", "STARTED", "ENDED",
                      "PROGRESS", "REASON"},
                rows);
  } else {
    print_table(out, {"JOB", "STATE", "ATTEMPT", "SHAPE", "NODES", "SUBMITTED", "PROGRESS", "REASON"}, rows);
  }
  return out.str();
}

// Whether the error is a coordinator that is away for now (restarting, unreachable).
bool is_transient(const Status& status) {
  return status.code() == StatusCode::kUnavailable || status.code() == StatusCode::kDeadlineExceeded;
}

// --watch: SIGINT and SIGTERM are blocked (before the client's threads start, which inherit the
// mask) and taken by sigtimedwait, which is also the wait between reads: Ctrl-C ends the watch at
// once, with exit status 0.
int watch(const CommandContext& context, const Options& options, const std::vector<cohort::v1::JobState>& states) {
  sigset_t stop, old_mask;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, &old_mask);
  int exit_status = kExitOk;
  {
    Client client(context.coordinator, context.client_options);
    const bool redraw = context.tty && context.human();
    std::string last;
    bool first = true;
    bool unreachable = false;
    auto interval = kWatchInitialInterval;
    auto unreachable_since = std::chrono::steady_clock::now();
    for (;;) {
      StatusOr<std::vector<cohort::v1::JobRecord>> jobs = client.list(states, options.all);
      if (!jobs.ok()) {
        if (!is_transient(jobs.status())) {
          exit_status = report_error(context, jobs.status());
          break;
        }
        const auto now = std::chrono::steady_clock::now();
        if (!unreachable) {
          unreachable = true;
          unreachable_since = now;
          *context.err << "cohort: coordinator unreachable, retrying: " << jobs.status().message() << '\n';
        } else if (now - unreachable_since > kWatchReconnectWindow) {
          exit_status = report_error(context, jobs.status());
          break;
        }
      } else {
        unreachable = false;
        std::string text = render(context, *jobs);
        if (first || text != last) {
          if (redraw) {
            // Home and clear, then the table under a line saying what this is.
            *context.out << "\x1b[H\x1b[2J"
                         << fmt::format("cohort list --watch (Ctrl-C to stop)  {}\n\n",
                                        format_time([] {
                                          google::protobuf::Timestamp now;
                                          now.set_seconds(static_cast<int64_t>(::time(nullptr)));
                                          return now;
                                        }()))
                         << text;
          } else {
            if (!first) *context.out << (context.format == OutputFormat::kYaml ? "---\n" : context.human() ? "\n" : "");
            *context.out << text;
          }
          context.out->flush();
          last = std::move(text);
          first = false;
          interval = kWatchInitialInterval;
        } else {
          interval = std::min(interval * 2, kWatchMaxInterval);
        }
      }
      const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(interval);
      const timespec wait = {static_cast<time_t>(seconds.count()),
                             static_cast<long>((interval - seconds).count() * 1000 * 1000)};
      if (sigtimedwait(&stop, nullptr, &wait) > 0) break;  // Ctrl-C / SIGTERM: done
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  return exit_status;
}

int run(const CommandContext& context, const Options& options) {
  std::vector<cohort::v1::JobState> states;
  for (const std::string& name : options.state_names) {
    // `--state --all`: CLI11 hands the next word over as the value; say what is missing.
    if (!name.empty() && name[0] == '-') {
      return usage_error(context, "list",
                         "--state needs a value, e.g. --state running (the next word is the option " + name + ")");
    }
    StatusOr<cohort::v1::JobState> state = parse_state(name);
    if (!state.ok()) return usage_error(context, "list", state.status().message());
    states.push_back(*state);
  }
  if (options.watch) return watch(context, options, states);
  Client client(context.coordinator, context.client_options);
  StatusOr<std::vector<cohort::v1::JobRecord>> jobs = client.list(states, options.all);
  if (!jobs.ok()) return report_error(context, jobs.status());
  *context.out << render(context, *jobs);
  return kExitOk;
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  auto options = std::make_shared<Options>();
  app->add_option("--state", options->state_names,
                  "only jobs in this state (pending, placed, running, succeeded, failed, cancelled); repeat "
                  "for several")
      ->type_name("STATE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_flag("--all", options->all, "every user's jobs (admins only)");
  app->add_flag("-w,--watch", options->watch, "keep watching: print the list again whenever it changes");
  return [options](const CommandContext& context) { return run(context, *options); };
}

}  // namespace

const Command kListCommand = {"list", "list jobs as a table (--watch to follow)", define};

}  // namespace cohort::client::commands
