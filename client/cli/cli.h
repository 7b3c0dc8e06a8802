#pragma once

// The `cohort` command line: global options (--coordinator, -o json, --help, --version), then a
// command from client/commands/ with its own arguments. cohort_main.cc calls run_cli with the real
// argv and streams; tests call it in-process with string streams.
//
//   std::ostringstream out, err;
//   int status = run_cli({"status", "mnist-1", "--coordinator", address, "-o", "json"}, {&out, &err});

#include <ostream>
#include <string>
#include <vector>

namespace cohort::client::cli {

struct CliIo {
  std::ostream* out = nullptr;  // results
  std::ostream* err = nullptr;  // errors
  bool tty = false;             // `out` is a terminal (progress bars)
  std::string program_path;     // the running binary, for finding cohort-worker next to it
};

// Runs one command line (without argv[0]); returns the process exit status (cli::kExitOk, ...).
// Blocks for as long as the command does (`run` and `--follow` until the job ends).
int run_cli(const std::vector<std::string>& args, const CliIo& io);

}  // namespace cohort::client::cli
