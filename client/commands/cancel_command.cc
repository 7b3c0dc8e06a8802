// cohort cancel JOB [--reason TEXT]

#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription =
    "Cancels a queued or running job: its workers get SIGTERM, then SIGKILL after the agent's grace\n"
    "period. Cancelling a finished job is an error. -o json / -o yaml print the job's record after the\n"
    "cancel.";

constexpr const char* kFooter = R"(examples:
  cohort cancel mnist-1
  cohort cancel mnist-1 --reason "wrong learning rate"
)";

struct Options {
  std::string job_id;
  std::string reason;
};

int run(const CommandContext& context, const Options& options) {
  Client client(context.coordinator, context.client_options);
  StatusOr<cohort::v1::JobRecord> job = client.cancel(options.job_id, options.reason);
  if (!job.ok()) return report_error(context, job.status());
  if (context.structured()) {
    print_structured(context, to_json(*job));
  } else {
    *context.out << "job " << job->id() << ": " << state_name(job->state())
                 << (job->reason().empty() ? "" : " (" + job->reason() + ")") << '\n';
  }
  return kExitOk;
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  auto options = std::make_shared<Options>();
  app->add_option("JOB", options->job_id, "the job's id")->required();
  app->add_option("--reason", options->reason, "recorded as the job's reason (default \"cancelled by a client\")")
      ->type_name("TEXT");
  return [options](const CommandContext& context) { return run(context, *options); };
}

}  // namespace

const Command kCancelCommand = {"cancel", "cancel a queued or running job", define};

}  // namespace cohort::client::commands
