// cohort user add NAME [--admin] | list | revoke NAME

#include <fmt/format.h>

#include "client/cli/args.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kHelp = R"(usage: cohort user add NAME [--admin]
       cohort user list
       cohort user revoke NAME

Manages the cluster's users (admins only).

  add NAME      creates a user and prints their credentials file (YAML: coordinator, ca_certificate,
                token). The token is shown only now: save it, e.g. to ~/.config/cohort/credentials
                (mode 0600), and hand it over securely. --admin makes an admin.
  list          every user, revoked ones included
  revoke NAME   stops accepting the user's token at once; their jobs keep running

examples:
  cohort user add alice > alice.credentials && chmod 600 alice.credentials
  cohort user list -o json
  cohort user revoke alice
)";

int run(const CommandContext& context, const std::vector<std::string>& raw_args) {
  StatusOr<Args> args = Args::parse(raw_args, {{"--admin", "", false}});
  if (!args.ok()) return usage_error(context, "user", args.status().message());
  const std::vector<std::string>& words = args->positional();
  const std::string verb = words.empty() ? "" : words[0];
  Client client(context.coordinator, context.client_options);
  if (verb == "add" && words.size() == 2) {
    StatusOr<std::string> credentials = client.add_user(words[1], args->has("--admin"));
    if (!credentials.ok()) return report_error(context, credentials.status());
    *context.out << *credentials;
    return kExitOk;
  }
  if (verb == "list" && words.size() == 1) {
    StatusOr<std::vector<cohort::v1::UserInfo>> users = client.list_users();
    if (!users.ok()) return report_error(context, users.status());
    if (context.format == OutputFormat::kJson) {
      cohort::v1::ListUsersResponse response;
      for (const cohort::v1::UserInfo& user : *users) *response.add_users() = user;
      *context.out << to_json(response);
      return kExitOk;
    }
    std::vector<std::vector<std::string>> rows;
    for (const cohort::v1::UserInfo& user : *users) {
      rows.push_back({user.name(), user.admin() ? "admin" : "user", user.revoked() ? "revoked" : "active",
                      format_time(user.create_time())});
    }
    print_table(*context.out, {"USER", "ROLE", "STATE", "CREATED"}, rows);
    return kExitOk;
  }
  if (verb == "revoke" && words.size() == 2) {
    if (Status status = client.revoke_user(words[1]); !status.ok()) return report_error(context, status);
    *context.out << "user " << words[1] << " revoked\n";
    return kExitOk;
  }
  return usage_error(context, "user", "use: cohort user add NAME [--admin] | list | revoke NAME");
}

}  // namespace

const Command kUserCommand = {"user", "add, list or revoke users (admins)", kHelp, run};

}  // namespace cohort::client::commands
