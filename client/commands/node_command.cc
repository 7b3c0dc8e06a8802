// cohort node token [--ttl HOURS] | revoke NODE

#include <charconv>

#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription =
    "Admits and removes nodes (admins only). `cohort nodes` lists the live ones.";

constexpr const char* kFooter = R"(examples:
  cohort node token --ttl 1
  cohort node revoke gpu-node-7
)";

// The longest a join token may live (the coordinator enforces it too).
constexpr int kMaxTokenHours = 720;

struct Options {
  int ttl_hours = 0;  // 0: the coordinator's default
  std::string node;
};

int token(const CommandContext& context, const Options& options) {
  Client client(context.coordinator, context.client_options);
  StatusOr<cohort::v1::CreateJoinTokenResponse> token = client.join_token(std::chrono::hours(options.ttl_hours));
  if (!token.ok()) return report_error(context, token.status());
  if (context.structured()) {
    print_structured(context, to_json(*token));
  } else {
    *context.out << token->token() << '\n';
  }
  return kExitOk;
}

int revoke(const CommandContext& context, const Options& options) {
  Client client(context.coordinator, context.client_options);
  if (Status status = client.revoke_node(options.node); !status.ok()) return report_error(context, status);
  *context.out << "node " << options.node << " revoked\n";
  return kExitOk;
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  app->require_subcommand(1);
  auto options = std::make_shared<Options>();
  CLI::App* token_app = app->add_subcommand(
      "token",
      "print a join token. On the new node: cohortd --role agent --coordinator HOST:PORT --join-token "
      "TOKEN --data-dir DIR. The node checks the coordinator's CA against the token, gets a certificate "
      "for its node id and keeps it in DIR/node; later starts need no token");
  token_app->add_option("--ttl", options->ttl_hours, "how long the token admits nodes (default 24 hours)")
      ->type_name("HOURS")
      ->check(CLI::Range(1, kMaxTokenHours));
  CLI::App* revoke_app = app->add_subcommand(
      "revoke",
      "stop accepting every certificate issued to NODE; its agent can no longer register, heartbeat or "
      "report, and its tasks fail over as for a lost node");
  revoke_app->add_option("NODE", options->node, "the node's id (cohort nodes)")->required();
  return [=](const CommandContext& context) {
    if (token_app->parsed()) return token(context, *options);
    if (revoke_app->parsed()) return revoke(context, *options);
    return usage_error(context, "node", "use: cohort node token [--ttl HOURS] | revoke NODE");
  };
}

}  // namespace

const Command kNodeCommand = {"node", "make join tokens and revoke nodes (admins)", define};

}  // namespace cohort::client::commands
