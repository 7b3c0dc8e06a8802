// cohort version

#include <fmt/format.h>

#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"
#include "worker/base/version.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription =
    "Prints this client's version and the coordinator's (its version and roles). -o json / -o yaml\n"
    "print {client: ..., server: {...}} (server: cohort.v1.VersionInfo).";

constexpr const char* kFooter = R"(examples:
  cohort version
  cohort version --coordinator 10.0.0.1:7070
)";

int run(const CommandContext& context) {
  Client client(context.coordinator, context.client_options);
  StatusOr<cohort::v1::VersionInfo> info = client.server_version();
  if (context.structured()) {
    if (!info.ok()) return report_error(context, info.status());
    std::string server = to_json(*info);
    while (!server.empty() && server.back() == '\n') server.pop_back();
    print_structured(context, fmt::format("{{\"client\": {}, \"server\": {}}}\n", json_quote(kVersion), server));
    return kExitOk;
  }
  *context.out << "cohort " << kVersion << '\n';
  if (!info.ok()) return report_error(context, info.status());
  *context.out << info->component() << ' ' << info->version() << " at " << context.coordinator << '\n';
  return kExitOk;
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  return [](const CommandContext& context) { return run(context); };
}

}  // namespace

const Command kVersionCommand = {"version", "print the client's and the coordinator's versions", define};

}  // namespace cohort::client::commands
