#pragma once

// One `cohort` command (submit, status, ...): its name, its CLI11 definition (arguments, options,
// help) and entry point, and the context every command runs in (the coordinator address, the output
// format, where output goes). The commands live in client/commands/, one file each; cli.cc builds
// one CLI11 App from them and dispatches.

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "client/client.h"

namespace CLI {
class App;
}  // namespace CLI

namespace cohort::client::cli {

// Exit statuses of the CLI (listed in `cohort --help`).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;    // a call failed: RPC error, unreachable coordinator, bad file
inline constexpr int kExitUsage = 2;      // a command line that cannot be run
inline constexpr int kExitJobFailed = 3;  // the followed or awaited job ended FAILED or CANCELLED

enum class OutputFormat {
  kHuman,  // tables and sentences
  kWide,   // tables with more columns (list, status, nodes)
  kJson,   // protobuf's JSON mapping of the records (field names as in the .proto files)
  kYaml,   // the same records as YAML (block style)
  kCsv,    // comma-separated rows with a header (only `cohort metrics`)
};

struct CommandContext {
  std::string coordinator;                     // HOST:PORT of the coordinator
  ClientOptions client_options;                // TLS and token from the credentials file
  OutputFormat format = OutputFormat::kHuman;  // -o json
  std::ostream* out = nullptr;                 // results
  std::ostream* err = nullptr;                 // errors and progress that is not the result
  bool tty = false;                            // `out` is a terminal: draw a progress bar
  std::string program_path;                    // the running cohort binary (/proc/self/exe), for `run`

  // -o json or -o yaml: print records (print_structured), no tables or progress.
  bool structured() const { return format == OutputFormat::kJson || format == OutputFormat::kYaml; }
  // Tables and sentences for people (-o human or -o wide).
  bool human() const { return format == OutputFormat::kHuman || format == OutputFormat::kWide; }
};

// Runs a parsed command; returns the exit status. Blocks for as long as the command does.
using CommandRunner = std::function<int(const CommandContext& context)>;

struct Command {
  const char* name;     // "submit"
  const char* summary;  // one line for the tool's --help
  // Declares the command's arguments and options (with their help), its description and examples
  // on `app` (its CLI11 subcommand), and returns what runs it once the whole line parsed; the
  // runner reads the values CLI11 stored. Called once per command line.
  CommandRunner (*define)(CLI::App* app);
};

}  // namespace cohort::client::cli
