// cohort: the command-line client of a cohort cluster.
//
//   cohort run job.yaml       # one job on this machine, in-process daemon
//   cohort submit job.yaml --follow              # to the coordinator at $COHORT_COORDINATOR
//   cohort status mnist-1 -o json
//   cohort --help
//
// main only hands argv to the CLI (client/cli/cli.h); the commands live in client/commands/.

#include <unistd.h>

#include <climits>
#include <iostream>
#include <string>
#include <vector>

#include "client/cli/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  cohort::client::cli::CliIo io;
  io.out = &std::cout;
  io.err = &std::cerr;
  io.tty = isatty(STDOUT_FILENO) == 1;
  char self[PATH_MAX] = {};
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (length > 0) io.program_path.assign(self, static_cast<size_t>(length));
  return cohort::client::cli::run_cli(args, io);
}
