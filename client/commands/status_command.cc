// cohort status JOB

#include <algorithm>
#include <ctime>

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
    "Shows one job: its state and why, attempt, times, where its ranks run, and its latest progress.\n"
    "-o wide adds the owner, the spec's training settings and the full metrics report; -o json and\n"
    "-o yaml print the job's record (cohort.v1.JobRecord).";

constexpr const char* kFooter = R"(examples:
  cohort status mnist-1
  cohort status mnist-1 -o wide
  cohort status mnist-1 -o json | jq -r .state
)";

void print_record(std::ostream& out, const cohort::v1::JobRecord& job, bool wide) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"job", job.id()});
  rows.push_back(
      {"state", state_name(job.state()) + (job.reason().empty() ? "" : " (" + job.reason() + ")")});
  rows.push_back({"name", job.spec().name()});
  if (wide) rows.push_back({"owner", job.owner().empty() ? "-" : job.owner()});
  rows.push_back(
      {"shape", fmt::format("{} node(s) x {} proc(s){}", job.spec().nodes(), job.spec().procs_per_node(),
                            job.spec().gpus_per_proc() > 0
                                ? fmt::format(", {} GPU(s) per proc", job.spec().gpus_per_proc())
                                : "")});
  rows.push_back({"attempt", std::to_string(job.attempt())});
  rows.push_back({"submitted", format_time(job.submit_time())});
  if (job.has_start_time()) rows.push_back({"started", format_time(job.start_time())});
  if (job.has_end_time()) rows.push_back({"ended", format_time(job.end_time())});
  if (job.has_start_time()) {
    const int64_t end =
        job.has_end_time() ? job.end_time().seconds() : static_cast<int64_t>(std::time(nullptr));
    rows.push_back({"run time", format_duration(end - job.start_time().seconds())});
  }
  if (!job.waiting_for().empty()) rows.push_back({"waiting for", job.waiting_for()});
  for (const cohort::v1::NodeAssignment& node : job.placement().nodes()) {
    std::string gpus;
    for (int gpu : node.gpus()) gpus += (gpus.empty() ? "" : ",") + std::to_string(gpu);
    rows.push_back(
        {fmt::format("node {}", node.node_rank()),
         fmt::format("{} at {}: ranks {}-{}{}", node.node_id(), node.address(), node.first_rank(),
                     node.first_rank() + node.num_ranks() - 1, gpus.empty() ? "" : ", GPUs " + gpus)});
  }
  if (job.has_last_metrics())
    rows.push_back({"progress", format_progress(job.last_metrics(), job.spec(), false)});
  if (wide) {
    const cohort::v1::JobSpec& spec = job.spec();
    rows.push_back({"training", fmt::format("{} epoch(s), batch size {}", spec.epochs(), spec.batch_size())});
    if (spec.has_optimizer()) {
      rows.push_back({"optimizer", fmt::format("{} lr {}", cohort::v1::OptimizerKind_Name(spec.optimizer().kind()),
                                               spec.optimizer().lr())});
    }
    if (job.has_last_metrics()) {
      const cohort::v1::Metrics& m = job.last_metrics();
      rows.push_back({"last report", fmt::format("epoch {} step {} loss {:.6f} accuracy {:.4f} {:.1f} samples/s",
                                                 m.epoch() + 1, m.step(), m.loss(), m.accuracy(),
                                                 m.samples_per_s())});
    }
  }
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row[0].size());
  for (const auto& row : rows) out << row[0] << std::string(width - row[0].size() + 2, ' ') << row[1] << '\n';
}

int run(const CommandContext& context, const std::string& job_id) {
  Client client(context.coordinator, context.client_options);
  StatusOr<cohort::v1::JobRecord> job = client.get(job_id);
  if (!job.ok()) return report_error(context, job.status());
  if (context.structured()) {
    print_structured(context, to_json(*job));
  } else {
    print_record(*context.out, *job, context.format == OutputFormat::kWide);
  }
  return kExitOk;
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  auto job_id = std::make_shared<std::string>();
  app->add_option("JOB", *job_id, "the job's id (cohort list shows them)")->required();
  return [job_id](const CommandContext& context) { return run(context, *job_id); };
}

}  // namespace

const Command kStatusCommand = {"status", "show one job: state, reason, placement, progress", define};

}  // namespace cohort::client::commands
