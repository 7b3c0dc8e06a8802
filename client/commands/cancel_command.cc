// cohort cancel JOB [--reason TEXT]

#include "client/cli/args.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kHelp = R"(usage: cohort cancel JOB [--reason TEXT]

Cancels a queued or running job: its workers get SIGTERM, then SIGKILL after the agent's grace period.
Cancelling a finished job is an error.

  --reason TEXT   recorded as the job's reason (default "cancelled by a client")

  -o json prints the job's record after the cancel.

examples:
  cohort cancel mnist-1
  cohort cancel mnist-1 --reason "wrong learning rate"
)";

int run(const CommandContext& context, const std::vector<std::string>& raw_args) {
  StatusOr<Args> args = Args::parse(raw_args, {{"--reason", "", true}});
  if (!args.ok()) return usage_error(context, "cancel", args.status().message());
  if (args->positional().size() != 1)
    return usage_error(context, "cancel", "give one job id: cohort cancel JOB");
  Client client(context.coordinator, context.client_options);
  StatusOr<cohort::v1::JobRecord> job = client.cancel(args->positional()[0], args->value("--reason"));
  if (!job.ok()) return report_error(context, job.status());
  if (context.format == OutputFormat::kJson) {
    *context.out << to_json(*job);
  } else {
    *context.out << "job " << job->id() << ": " << state_name(job->state())
                 << (job->reason().empty() ? "" : " (" + job->reason() + ")") << '\n';
  }
  return kExitOk;
}

}  // namespace

const Command kCancelCommand = {"cancel", "cancel a queued or running job", kHelp, run};

}  // namespace cohort::client::commands
