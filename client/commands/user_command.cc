// cohort user add NAME [--admin] | list | revoke NAME

#include <fmt/format.h>

#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription = "Manages the cluster's users (admins only).";

constexpr const char* kFooter = R"(examples:
  cohort user add alice > alice.credentials && chmod 600 alice.credentials
  cohort user list -o json
  cohort user revoke alice
)";

struct Options {
  std::string name;
  bool admin = false;
};

int add(const CommandContext& context, const Options& options) {
  Client client(context.coordinator, context.client_options);
  StatusOr<std::string> credentials = client.add_user(options.name, options.admin);
  if (!credentials.ok()) return report_error(context, credentials.status());
  *context.out << *credentials;
  return kExitOk;
}

int list(const CommandContext& context) {
  Client client(context.coordinator, context.client_options);
  StatusOr<std::vector<cohort::v1::UserInfo>> users = client.list_users();
  if (!users.ok()) return report_error(context, users.status());
  if (context.structured()) {
    cohort::v1::ListUsersResponse response;
    for (const cohort::v1::UserInfo& user : *users) *response.add_users() = user;
    print_structured(context, to_json(response));
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

int revoke(const CommandContext& context, const Options& options) {
  Client client(context.coordinator, context.client_options);
  if (Status status = client.revoke_user(options.name); !status.ok()) return report_error(context, status);
  *context.out << "user " << options.name << " revoked\n";
  return kExitOk;
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  app->require_subcommand(1);
  auto options = std::make_shared<Options>();
  CLI::App* add_app = app->add_subcommand(
      "add",
      "create a user and print their credentials file (YAML: coordinator, ca_certificate, token). The "
      "token is shown only now: save it, e.g. to ~/.config/cohort/credentials (mode 0600), and hand it "
      "over securely");
  add_app->add_option("NAME", options->name, "the user's name")->required();
  add_app->add_flag("--admin", options->admin, "make an admin");
  CLI::App* list_app = app->add_subcommand("list", "every user, revoked ones included");
  CLI::App* revoke_app =
      app->add_subcommand("revoke", "stop accepting the user's token at once; their jobs keep running");
  revoke_app->add_option("NAME", options->name, "the user's name")->required();
  return [=](const CommandContext& context) {
    if (add_app->parsed()) return add(context, *options);
    if (list_app->parsed()) return list(context);
    if (revoke_app->parsed()) return revoke(context, *options);
    return usage_error(context, "user", "use: cohort user add NAME [--admin] | list | revoke NAME");
  };
}

}  // namespace

const Command kUserCommand = {"user", "add, list or revoke users (admins)", define};

}  // namespace cohort::client::commands
