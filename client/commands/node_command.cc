// cohort node token [--ttl HOURS] | revoke NODE

#include <charconv>

#include "client/cli/args.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kHelp = R"(usage: cohort node token [--ttl HOURS]
       cohort node revoke NODE

Admits and removes nodes (admins only). `cohort nodes` lists the live ones.

  token         prints a join token. On the new node:
                  cohortd --role agent --coordinator HOST:PORT --join-token TOKEN --data-dir DIR
                The node checks the coordinator's CA against the token, gets a certificate for its
                node id, and keeps it in DIR/node; later starts need no token. --ttl: how long the
                token admits nodes (default 24 hours, at most 720).
  revoke NODE   stops accepting every certificate issued to NODE; its agent can no longer register,
                heartbeat or report, and the coordinator's tasks for it fail over as for a lost node

examples:
  cohort node token --ttl 1
  cohort node revoke gpu-node-7
)";

int run(const CommandContext& context, const std::vector<std::string>& raw_args) {
  StatusOr<Args> args = Args::parse(raw_args, {{"--ttl", "", true}});
  if (!args.ok()) return usage_error(context, "node", args.status().message());
  const std::vector<std::string>& words = args->positional();
  const std::string verb = words.empty() ? "" : words[0];
  Client client(context.coordinator, context.client_options);
  if (verb == "token" && words.size() == 1) {
    int hours = 0;
    const std::string ttl = args->value("--ttl");
    if (!ttl.empty()) {
      auto [end, error] = std::from_chars(ttl.data(), ttl.data() + ttl.size(), hours);
      if (error != std::errc() || end != ttl.data() + ttl.size() || hours < 1)
        return usage_error(context, "node", "--ttl takes a whole number of hours, at least 1");
    }
    StatusOr<cohort::v1::CreateJoinTokenResponse> token = client.join_token(std::chrono::hours(hours));
    if (!token.ok()) return report_error(context, token.status());
    if (context.format == OutputFormat::kJson) {
      *context.out << to_json(*token);
    } else {
      *context.out << token->token() << '\n';
    }
    return kExitOk;
  }
  if (verb == "revoke" && words.size() == 2) {
    if (Status status = client.revoke_node(words[1]); !status.ok()) return report_error(context, status);
    *context.out << "node " << words[1] << " revoked\n";
    return kExitOk;
  }
  return usage_error(context, "node", "use: cohort node token [--ttl HOURS] | revoke NODE");
}

}  // namespace

const Command kNodeCommand = {"node", "make join tokens and revoke nodes (admins)", kHelp, run};

}  // namespace cohort::client::commands
