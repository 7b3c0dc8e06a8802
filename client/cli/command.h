#pragma once

// One `cohort` command (submit, status, ...): its name, help text and entry point, and the context
// every command runs in (the coordinator address, the output format, where output goes). The
// commands live in client/commands/, one file each; cli.cc dispatches to them.

#include <ostream>
#include <string>
#include <vector>

#include "client/client.h"

namespace cohort::client::cli {

// Exit statuses of the CLI.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // an RPC failed, or the followed job did not succeed
inline constexpr int kExitUsage = 2;    // a command line that cannot be run

enum class OutputFormat {
  kHuman,  // tables and sentences
  kJson,   // protobuf's JSON mapping of the records (field names as in the .proto files)
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
};

struct Command {
  const char* name;     // "submit"
  const char* summary;  // one line for the tool's --help
  const char* help;     // the command's --help: usage, options, examples
  // Runs with the arguments after the command name (global options removed). Returns the exit status.
  int (*run)(const CommandContext& context, const std::vector<std::string>& args);
};

}  // namespace cohort::client::cli
