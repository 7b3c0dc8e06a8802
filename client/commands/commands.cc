#include "client/commands/commands.h"

namespace cohort::client::commands {

std::vector<const cli::Command*> all_commands() {
  return {&kSubmitCommand, &kStatusCommand,  &kListCommand, &kWaitCommand, &kLogsCommand,
          &kMetricsCommand, &kCancelCommand, &kNodesCommand, &kRunCommand,  &kVersionCommand,
          &kUserCommand,   &kNodeCommand,    &kCompletionCommand};
}

}  // namespace cohort::client::commands
