// cohort submit JOB.yaml [--follow] [--wait-for-capacity]

#include <fmt/format.h>

#include "client/cli/args.h"
#include "client/cli/job_follower.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "client/job_spec_yaml.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kHelp = R"(usage: cohort submit JOB.yaml [--follow] [--wait-for-capacity]

Reads a YAML job file (keys as in proto/cohort/v1/job.proto; see configs/jobs/), validates it and
queues it on the coordinator. Prints the job id. A bad file is rejected before anything starts, with
every problem named by file, line and field.

  --follow, -f   then follow the job: state changes and a progress line (a bar on a terminal) until
                 it ends; exit status 0 only if it SUCCEEDED
  --wait-for-capacity
                 queue the job even when it needs more nodes or slots than the cluster has now
                 (otherwise it is refused, naming both numbers); it starts once enough nodes join

  -o json prints {"job_id": "..."} (with --follow, then the final record).

examples:
  cohort submit configs/jobs/fashion_mnist_dp.yaml
  cohort submit job.yaml --follow --coordinator 10.0.0.1:7070
  id=$(cohort submit job.yaml -o json | jq -r .job_id)
)";

int run(const CommandContext& context, const std::vector<std::string>& raw_args) {
  StatusOr<Args> args =
      Args::parse(raw_args, {{"--follow", "-f", false}, {"--wait-for-capacity", "", false}});
  if (!args.ok()) return usage_error(context, "submit", args.status().message());
  if (args->positional().size() != 1)
    return usage_error(context, "submit", "give one job file: cohort submit JOB.yaml");
  StatusOr<cohort::v1::JobSpec> spec = load_job_spec_file(args->positional()[0]);
  if (!spec.ok()) return report_error(context, spec.status());
  Client client(context.coordinator, context.client_options);
  StatusOr<std::string> id = client.submit(*spec, args->has("--wait-for-capacity"));
  if (!id.ok()) return report_error(context, id.status());
  if (context.format == OutputFormat::kJson) {
    *context.out << fmt::format("{{\"job_id\": {}}}\n", json_quote(*id));
  } else {
    *context.out << "submitted job " << *id << '\n';
  }
  context.out->flush();
  if (!args->has("--follow")) return kExitOk;
  StatusOr<cohort::v1::JobRecord> job = follow_job(client, *id, context);
  if (!job.ok()) return report_error(context, job.status());
  if (context.format == OutputFormat::kJson) *context.out << to_json(*job);
  return job->state() == cohort::v1::SUCCEEDED ? kExitOk : kExitFailure;
}

}  // namespace

const Command kSubmitCommand = {"submit", "queue a job from a YAML file (--follow to watch it)", kHelp, run};

}  // namespace cohort::client::commands
