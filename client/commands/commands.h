#pragma once

// The `cohort` commands, one per file in this directory. Each is a Command (client/cli/command.h):
// a name, a summary, and a CLI11 definition (arguments, options, help with examples) that returns
// the run function over the client library.

#include <vector>

#include "client/cli/command.h"

namespace cohort::client::commands {

extern const cli::Command kSubmitCommand;   // submit_command.cc
extern const cli::Command kStatusCommand;   // status_command.cc
extern const cli::Command kListCommand;     // list_command.cc
extern const cli::Command kLogsCommand;     // logs_command.cc
extern const cli::Command kMetricsCommand;  // metrics_command.cc
extern const cli::Command kCancelCommand;   // cancel_command.cc
extern const cli::Command kNodesCommand;    // nodes_command.cc
extern const cli::Command kRunCommand;      // run_command.cc
extern const cli::Command kVersionCommand;  // version_command.cc
extern const cli::Command kUserCommand;     // user_command.cc
extern const cli::Command kNodeCommand;     // node_command.cc
extern const cli::Command kWaitCommand;     // wait_command.cc
extern const cli::Command kCompletionCommand;  // completion_command.cc

// Every command, in the order the tool's --help lists them.
std::vector<const cli::Command*> all_commands();

}  // namespace cohort::client::commands
