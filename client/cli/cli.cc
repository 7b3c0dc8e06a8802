#include "client/cli/cli.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "client/cli/command.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"
#include "worker/base/credentials_file.h"
#include "worker/base/leader_channel.h"
#include "worker/base/version.h"

namespace cohort::client::cli {
namespace {

constexpr const char* kDescription =
    "cohort submits training jobs to a cohort cluster, follows them, reads their logs, and runs one job\n"
    "on this machine with no daemon (`cohort run`). The options below go anywhere on the line;\n"
    "`cohort COMMAND --help` shows a command's own.";

constexpr const char* kFooter =
    "exit status:\n"
    "  0  done (a followed or awaited job SUCCEEDED)\n"
    "  1  a call failed: the coordinator refused or could not be reached, a file could not be read\n"
    "  2  usage: the command line cannot be run (unknown option, missing argument, bad value)\n"
    "  3  the job ended FAILED or CANCELLED (submit --follow, wait, run)\n"
    "\n"
    "examples:\n"
    "  cohort run configs/jobs/fashion_mnist_dp.yaml        # one job here, no daemon needed\n"
    "  cohort submit configs/jobs/fashion_mnist_dp.yaml -f  # to $COHORT_COORDINATOR, and follow\n"
    "  cohort submit job.yaml --set optimizer.lr=0.01 --set epochs=3\n"
    "  cohort list --watch -o wide\n"
    "  cohort logs mnist-1 --rank 0 -f\n"
    "  source <(cohort completion bash)\n";

// Which -o formats a command prints (human and json everywhere else).
bool accepts_format(const std::string& command, OutputFormat format) {
  switch (format) {
    case OutputFormat::kHuman:
    case OutputFormat::kJson:
      return true;
    case OutputFormat::kWide:
      return command == "list" || command == "status" || command == "nodes";
    case OutputFormat::kYaml:
      // logs and metrics stream records one per line; YAML documents would not.
      return command != "logs" && command != "metrics";
    case OutputFormat::kCsv:
      return command == "metrics";
  }
  return false;
}

StatusOr<OutputFormat> parse_format(const std::string& name) {
  if (name == "human") return OutputFormat::kHuman;
  if (name == "wide") return OutputFormat::kWide;
  if (name == "json") return OutputFormat::kJson;
  if (name == "yaml") return OutputFormat::kYaml;
  if (name == "csv") return OutputFormat::kCsv;
  return invalid_argument_error(
      "-o takes human, wide (list, status, nodes), json, yaml or csv (cohort metrics), not '{}'", name);
}

std::string command_names() {
  std::string names;
  for (const Command* command : commands::all_commands()) names += (names.empty() ? "" : ", ") + std::string(command->name);
  return names;
}

}  // namespace

int run_cli(const std::vector<std::string>& args, const CliIo& io) {
  auto app = cli_flags::make_app("cohort", kDescription);
  app->footer(kFooter);
  // Global options may follow the command's name (`cohort status JOB -o json`).
  app->fallthrough();
  app->require_subcommand(0, 1);

  std::string coordinator;
  CLI::Option* coordinator_option =
      app->add_option("--coordinator", coordinator,
                      fmt::format("the coordinator (default: the credentials file's, else {}); several, "
                                  "comma-separated (h1:7070,h2:7070), for highly available coordinators: "
                                  "calls go to whichever leads",
                                  kDefaultCoordinatorAddress))
          ->type_name("HOST:PORT")
          ->envname("COHORT_COORDINATOR");
  std::string credentials_flag;
  CLI::Option* credentials_option =
      app->add_option("--credentials", credentials_flag,
                      "your credentials (YAML: coordinator, ca_certificate, token); default: "
                      "~/.config/cohort/credentials. An admin makes one with `cohort user add NAME`; the "
                      "first admin's is DATA_DIR/admin.credentials on the coordinator. Without one, cohort "
                      "talks plaintext (only a daemon with `insecure: true` accepts that)")
          ->type_name("FILE")
          ->envname(kCredentialsEnv);
  std::string format_name = "human";
  app->add_option("-o,--output", format_name,
                  "human (default); wide: more columns (list, status, nodes); json: the records in "
                  "protobuf's JSON mapping; yaml: the same as YAML; csv: cohort metrics")
      ->type_name("FORMAT");

  // Each command declares its options on its subcommand; only the chosen one's runner runs.
  std::vector<std::pair<CLI::App*, CommandRunner>> runners;
  for (const Command* command : commands::all_commands()) {
    CLI::App* sub = app->add_subcommand(command->name, command->summary);
    runners.emplace_back(sub, command->define(sub));
    // Listed by its summary; its own --help adds the description the command set.
    const std::string description = sub->get_description();
    sub->description(description == command->summary ? description
                                                     : std::string(command->summary) + "\n\n" + description);
  }

  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app->parse(reversed);
  } catch (const CLI::CallForHelp&) {
    *io.out << app->help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    *io.out << app->help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::CallForVersion& version) {
    *io.out << version.what() << '\n';
    return kExitOk;
  } catch (const CLI::ParseError& error) {
    std::string program = "cohort";
    const std::vector<CLI::App*> chosen = app->get_subcommands();
    if (!chosen.empty()) program += " " + chosen.front()->get_name();
    const std::vector<std::string> extras = app->remaining();
    std::string message = cli_flags::error_message(error);
    if (chosen.empty() && dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr && !extras.empty()) {
      message = extras.front().rfind('-', 0) == 0
                    ? fmt::format("unknown option '{}'", extras.front())
                    : fmt::format("unknown command '{}' (commands: {})", extras.front(), command_names());
    }
    *io.err << program << ": " << message << "\nrun '" << program << " --help' for the options\n";
    return kExitUsage;
  }

  const std::vector<CLI::App*> chosen = app->get_subcommands();
  if (chosen.empty()) {
    *io.err << "cohort: no command given\n\n" << app->help();
    return kExitUsage;
  }
  const std::string name = chosen.front()->get_name();
  CommandContext context;
  context.coordinator = default_coordinator_address();
  context.out = io.out;
  context.err = io.err;
  context.tty = io.tty;
  context.program_path = io.program_path;
  StatusOr<OutputFormat> format = parse_format(format_name);
  if (!format.ok()) {
    *io.err << "cohort: " << format.status().message() << '\n';
    return kExitUsage;
  }
  context.format = *format;
  if (!accepts_format(name, context.format)) {
    *io.err << "cohort: -o " << format_name << " is for "
            << (context.format == OutputFormat::kCsv    ? "cohort metrics"
                : context.format == OutputFormat::kWide ? "cohort list, status and nodes"
                                                        : "records, not streams")
            << "; " << name << " prints human, json"
            << (accepts_format(name, OutputFormat::kYaml) ? " or yaml" : "") << '\n';
    return kExitUsage;
  }
  const bool coordinator_given = coordinator_option->count() > 0;
  if (coordinator_given) {
    if (coordinator.empty()) {
      *io.err << "cohort: --coordinator needs HOST:PORT\n";
      return kExitUsage;
    }
    context.coordinator = coordinator;
  }
  if (credentials_option->count() > 0 && credentials_flag.empty()) {
    *io.err << "cohort: --credentials needs FILE\n";
    return kExitUsage;
  }
  // `run` starts its own cluster in-process and `completion` prints a script: no credentials.
  if (name != "run" && name != "completion") {
    const std::string path = credentials_path(credentials_flag);
    const bool explicit_path = credentials_option->count() > 0;
    if (explicit_path || (!path.empty() && ::access(path.c_str(), F_OK) == 0)) {
      StatusOr<Credentials> credentials = load_credentials(path);
      if (!credentials.ok()) {
        *io.err << "cohort: " << credentials.status().message() << '\n';
        return kExitUsage;
      }
      context.client_options.security.insecure = false;
      context.client_options.security.ca_pem = credentials->ca_certificate;
      context.client_options.security.bearer_token = credentials->token;
      if (!coordinator_given) context.coordinator = credentials->coordinator;
    }
    // One address or a list of highly available coordinators (issue 16).
    if (StatusOr<std::vector<std::string>> addresses = tls::parse_address_list(context.coordinator);
        !addresses.ok()) {
      *io.err << "cohort: " << addresses.status().message() << " (from --coordinator, $COHORT_COORDINATOR or the "
              << "credentials file)\n";
      return kExitUsage;
    }
  }
  for (const auto& [sub, runner] : runners) {
    if (sub == chosen.front()) return runner(context);
  }
  return kExitUsage;  // unreachable: every subcommand has a runner
}

}  // namespace cohort::client::cli
