// cohort version

#include <fmt/format.h>

#include "client/cli/args.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/version.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kHelp = R"(usage: cohort version

Prints this client's version and the coordinator's (its version and roles).

  -o json prints {"client": "...", "server": {...}} (server: cohort.v1.VersionInfo).

examples:
  cohort version
  cohort version --coordinator 10.0.0.1:7070
)";

int run(const CommandContext& context, const std::vector<std::string>& raw_args) {
  StatusOr<Args> args = Args::parse(raw_args, {});
  if (!args.ok()) return usage_error(context, "version", args.status().message());
  Client client(context.coordinator, context.client_options);
  StatusOr<cohort::v1::VersionInfo> info = client.server_version();
  if (context.format == OutputFormat::kJson) {
    if (!info.ok()) return report_error(context, info.status());
    std::string server = to_json(*info);
    while (!server.empty() && server.back() == '\n') server.pop_back();
    *context.out << fmt::format("{{\"client\": {}, \"server\": {}}}\n", json_quote(kVersion), server);
    return kExitOk;
  }
  *context.out << "cohort " << kVersion << '\n';
  if (!info.ok()) return report_error(context, info.status());
  *context.out << info->component() << ' ' << info->version() << " at " << context.coordinator << '\n';
  return kExitOk;
}

}  // namespace

const Command kVersionCommand = {"version", "print the client's and the coordinator's versions", kHelp, run};

}  // namespace cohort::client::commands
