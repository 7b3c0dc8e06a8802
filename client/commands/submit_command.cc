// cohort submit JOB.yaml [--set PATH=VALUE]... [--follow] [--wait-for-capacity]

#include <fmt/format.h>

#include "client/cli/job_follower.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "client/job_spec_yaml.h"
#include "worker/base/cli_flags.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription =
    "Reads a YAML job file (keys as in proto/cohort/v1/job.proto; see configs/jobs/), applies the\n"
    "--set overrides, validates it and queues it on the coordinator. Prints the job id. A bad file is\n"
    "rejected before anything starts, with every problem named by file, line and field. -o json / -o\n"
    "yaml print {job_id: ...} (with --follow, then the final record).";

constexpr const char* kFooter = R"(exit status: 0 queued (with --follow: SUCCEEDED), 1 a call or the file failed, 2 usage
(a bad --set included), 3 the followed job ended FAILED or CANCELLED.

examples:
  cohort submit configs/jobs/fashion_mnist_dp.yaml
  cohort submit job.yaml --follow --coordinator 10.0.0.1:7070
  cohort submit job.yaml --set optimizer.lr=0.01 --set epochs=3
  for lr in 0.1 0.03 0.01; do cohort submit job.yaml --set optimizer.lr=$lr --set name=lr-$lr; done
  id=$(cohort submit job.yaml -o json | jq -r .job_id)
)";

struct Options {
  std::string file;
  std::vector<std::string> sets;
  bool follow = false;
  bool wait_for_capacity = false;
};

int run(const CommandContext& context, const Options& options) {
  std::vector<JobSpecOverride> overrides;
  for (const std::string& set : options.sets) {
    StatusOr<JobSpecOverride> override_ = parse_job_spec_override(set);
    if (!override_.ok()) return usage_error(context, "submit", override_.status().message());
    overrides.push_back(*std::move(override_));
  }
  StatusOr<cohort::v1::JobSpec> spec = load_job_spec_file(options.file, overrides);
  if (!spec.ok()) return report_error(context, spec.status());
  Client client(context.coordinator, context.client_options);
  StatusOr<std::string> id = client.submit(*spec, options.wait_for_capacity);
  if (!id.ok()) return report_error(context, id.status());
  if (context.structured()) {
    print_structured(context, fmt::format("{{\"job_id\": {}}}\n", json_quote(*id)));
  } else {
    *context.out << "submitted job " << *id << '\n';
  }
  context.out->flush();
  if (!options.follow) return kExitOk;
  StatusOr<cohort::v1::JobRecord> job = follow_job(client, *id, context);
  if (!job.ok()) return report_error(context, job.status());
  if (context.structured()) print_structured(context, to_json(*job));
  return job->state() == cohort::v1::SUCCEEDED ? kExitOk : kExitJobFailed;
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  auto options = std::make_shared<Options>();
  app->add_option("JOB.yaml", options->file, "the job file")->required();
  app->add_option("--set", options->sets,
                  "replace (or add) one field of the file before it is read: a dotted path of proto field "
                  "names, a value typed by that field (optimizer.lr=0.01, epochs=3, env.SEED=7, "
                  "data_parallel.graph.layers.0.out_features=256, rank_out=[1,2]); repeat for several")
      ->type_name("PATH=VALUE")
      ->take_last()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_flag("-f,--follow", options->follow,
                "then follow the job: state changes and a progress line (a bar on a terminal) until it ends");
  app->add_flag("--wait-for-capacity", options->wait_for_capacity,
                "queue the job even when it needs more nodes or slots than the cluster has now (otherwise "
                "it is refused, naming both numbers); it starts once enough nodes join");
  return [options](const CommandContext& context) { return run(context, *options); };
}

}  // namespace

const Command kSubmitCommand = {"submit", "queue a job from a YAML file (--set to override, --follow to watch)",
                                define};

}  // namespace cohort::client::commands
