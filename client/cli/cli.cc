#include "client/cli/cli.h"

#include <fmt/format.h>

#include "client/cli/command.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/version.h"

#include <unistd.h>

#include <cstdlib>

#include "worker/base/credentials_file.h"

namespace cohort::client::cli {
namespace {

std::string tool_usage() {
  std::string text =
      "usage: cohort [--credentials FILE] [--coordinator HOST:PORT] [-o json] <command> [args]\n"
      "       cohort <command> --help\n"
      "\n"
      "cohort submits training jobs to a cohort cluster, follows them, reads their logs, and runs one job\n"
      "on this machine with no daemon (`cohort run`).\n"
      "\n"
      "commands:\n";
  for (const Command* command : commands::all_commands()) {
    text += fmt::format("  {:<9} {}\n", command->name, command->summary);
  }
  text += fmt::format(
      "\n"
      "options (anywhere on the line):\n"
      "  --credentials FILE       your credentials (YAML: coordinator, ca_certificate, token); default:\n"
      "                           $COHORT_CREDENTIALS, else ~/.config/cohort/credentials. An admin makes\n"
      "                           one with `cohort user add NAME`; the first admin's is\n"
      "                           DATA_DIR/admin.credentials on the coordinator. Without one, cohort\n"
      "                           talks plaintext (only a daemon with `insecure: true` accepts that)\n"
      "  --coordinator HOST:PORT  the coordinator (default: $COHORT_COORDINATOR, else the credentials\n"
      "                           file's, else {})\n"
      "  -o, --output FORMAT      human (default) or json: the records in protobuf's JSON mapping;\n"
      "                           csv for `cohort metrics`\n"
      "  -h, --help               this help, or a command's with `cohort <command> --help`\n"
      "  --version                print the client's version\n"
      "\n"
      "examples:\n"
      "  cohort run configs/jobs/fashion_mnist_dp.yaml        # one job here, no daemon needed\n"
      "  cohort submit configs/jobs/fashion_mnist_dp.yaml -f  # to $COHORT_COORDINATOR, and follow\n"
      "  cohort list -o json\n"
      "  cohort logs mnist-1 --rank 0 -f\n",
      kDefaultCoordinatorAddress);
  return text;
}

}  // namespace

int run_cli(const std::vector<std::string>& args, const CliIo& io) {
  CommandContext context;
  context.coordinator = default_coordinator_address();
  context.out = io.out;
  context.err = io.err;
  context.tty = io.tty;
  context.program_path = io.program_path;
  const Command* command = nullptr;
  bool help = false;
  bool coordinator_given = std::getenv("COHORT_COORDINATOR") != nullptr;
  std::string credentials_flag;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    auto value_of = [&](const std::string& flag, std::string* value) -> int {
      // 1: matched with a value, 0: not this flag, -1: matched without its value.
      if (arg.rfind(flag + "=", 0) == 0) {
        *value = arg.substr(flag.size() + 1);
        return 1;
      }
      if (arg != flag) return 0;
      if (i + 1 >= args.size()) return -1;
      *value = args[++i];
      return 1;
    };
    std::string value;
    int matched = value_of("--coordinator", &value);
    if (matched != 0) {
      if (matched < 0 || value.empty()) {
        *io.err << "cohort: --coordinator needs HOST:PORT\n";
        return kExitUsage;
      }
      context.coordinator = value;
      coordinator_given = true;
      continue;
    }
    matched = value_of("--credentials", &value);
    if (matched != 0) {
      if (matched < 0 || value.empty()) {
        *io.err << "cohort: --credentials needs FILE\n";
        return kExitUsage;
      }
      credentials_flag = value;
      continue;
    }
    matched = value_of("--output", &value);
    if (matched == 0) matched = value_of("-o", &value);
    if (matched == 0 && arg.size() > 2 && arg.rfind("-o", 0) == 0 && arg[2] != '=') {
      value = arg.substr(2);  // -ojson
      matched = 1;
    }
    if (matched != 0) {
      if (matched > 0 && value == "json") {
        context.format = OutputFormat::kJson;
      } else if (matched > 0 && value == "csv") {
        context.format = OutputFormat::kCsv;
      } else if (matched > 0 && value == "human") {
        context.format = OutputFormat::kHuman;
      } else {
        *io.err << "cohort: -o takes json, csv (cohort metrics) or human"
                << (matched > 0 ? ", not '" + value + "'" : "") << '\n';
        return kExitUsage;
      }
      continue;
    }
    if (arg == "--help" || arg == "-h") {
      help = true;
      continue;
    }
    if (command == nullptr && arg == "--version") {
      *io.out << "cohort " << kVersion << '\n';
      return kExitOk;
    }
    if (command == nullptr && !arg.empty() && arg[0] != '-') {
      for (const Command* candidate : commands::all_commands()) {
        if (arg == candidate->name) command = candidate;
      }
      if (command == nullptr) {
        *io.err << "cohort: unknown command '" << arg << "'\n\n" << tool_usage();
        return kExitUsage;
      }
      continue;
    }
    if (command == nullptr) {
      *io.err << "cohort: unknown option '" << arg << "' (options of a command go after its name)\n\n"
              << tool_usage();
      return kExitUsage;
    }
    rest.push_back(arg);
  }
  if (command == nullptr) {
    if (help) {
      *io.out << tool_usage();
      return kExitOk;
    }
    *io.err << "cohort: no command given\n\n" << tool_usage();
    return kExitUsage;
  }
  if (help) {
    *io.out << command->help;
    return kExitOk;
  }
  if (context.format == OutputFormat::kCsv && std::string(command->name) != "metrics") {
    *io.err << "cohort: -o csv is for cohort metrics; " << command->name << " prints human or json\n";
    return kExitUsage;
  }
  // `run` starts its own cluster in-process and needs no credentials.
  if (std::string(command->name) != "run") {
    const std::string path = credentials_path(credentials_flag);
    const bool explicit_path = !credentials_flag.empty() || std::getenv(kCredentialsEnv) != nullptr;
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
  }
  return command->run(context, rest);
}

}  // namespace cohort::client::cli
