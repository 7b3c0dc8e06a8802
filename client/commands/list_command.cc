// cohort list [--state STATE]

#include <fmt/format.h>

#include "client/cli/args.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kHelp = R"(usage: cohort list [--state STATE]... [--all]

Lists your jobs in submission order as a table.

  --all           every user's jobs (admins only)
  --state STATE   only jobs in this state (pending, placed, running, succeeded, failed, cancelled);
                  repeat for several

  -o json prints {"jobs": [...]} (cohort.v1.ListJobsResponse).

examples:
  cohort list
  cohort list --state running --state pending
  cohort list -o json | jq -r '.jobs[].id'
)";

int run(const CommandContext& context, const std::vector<std::string>& raw_args) {
  std::vector<cohort::v1::JobState> states;
  std::vector<std::string> rest;
  // --state repeats, which Args keeps only once: take them out first.
  for (size_t i = 0; i < raw_args.size(); ++i) {
    std::string name;
    if (raw_args[i] == "--state") {
      if (i + 1 >= raw_args.size())
        return usage_error(context, "list", "--state needs a value, e.g. --state running");
      name = raw_args[++i];
    } else if (raw_args[i].rfind("--state=", 0) == 0) {
      name = raw_args[i].substr(8);
    } else {
      rest.push_back(raw_args[i]);
      continue;
    }
    StatusOr<cohort::v1::JobState> state = parse_state(name);
    if (!state.ok()) return usage_error(context, "list", state.status().message());
    states.push_back(*state);
  }
  StatusOr<Args> args = Args::parse(rest, {{"--all", "", false}});
  if (!args.ok()) return usage_error(context, "list", args.status().message());
  if (!args->positional().empty())
    return usage_error(context, "list", "list takes no job id; see `cohort status JOB`");
  Client client(context.coordinator, context.client_options);
  StatusOr<std::vector<cohort::v1::JobRecord>> jobs = client.list(states, args->has("--all"));
  if (!jobs.ok()) return report_error(context, jobs.status());
  if (context.format == OutputFormat::kJson) {
    cohort::v1::ListJobsResponse response;
    for (const cohort::v1::JobRecord& job : *jobs) *response.add_jobs() = job;
    *context.out << to_json(response);
    return kExitOk;
  }
  if (jobs->empty()) {
    *context.out << "no jobs\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const cohort::v1::JobRecord& job : *jobs) {
    std::string nodes;
    for (const cohort::v1::NodeAssignment& node : job.placement().nodes())
      nodes += (nodes.empty() ? "" : ",") + node.node_id();
    std::string progress = "-";
    if (job.has_last_metrics()) {
      progress = fmt::format("epoch {} step {} loss {:.4f}", job.last_metrics().epoch() + 1,
                             job.last_metrics().step(), job.last_metrics().loss());
    }
    rows.push_back({job.id(), state_name(job.state()), std::to_string(job.attempt()),
                    fmt::format("{}x{}", job.spec().nodes(), job.spec().procs_per_node()),
                    nodes.empty() ? "-" : nodes, format_time(job.submit_time()), progress,
                    job.state() == cohort::v1::PENDING && !job.waiting_for().empty() ? job.waiting_for()
                                                                                     : job.reason()});
  }
  print_table(*context.out, {"JOB", "STATE", "ATTEMPT", "SHAPE", "NODES", "SUBMITTED", "PROGRESS", "REASON"},
              rows);
  return kExitOk;
}

}  // namespace

const Command kListCommand = {"list", "list jobs as a table", kHelp, run};

}  // namespace cohort::client::commands
