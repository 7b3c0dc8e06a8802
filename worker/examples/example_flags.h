#pragma once

// The flags every example (and bench/train_fashion_mnist) takes, on cohort's one flag library
// (CLI11 through worker/base/cli_flags.h: the same --help shape, --version, errors and exit 2):
//   --ranks N     start N local ranks (processes over a file:// store; see local_ranks.h)
//   --init URL    join a job: env://, tcp://host:port, file:///path?rank=R&world_size=N
//   --kind KIND   communicator kind (default flat)
//   --epochs E    passes over the training set (default 1)
//   --limit N     use only the first N training and test samples (default 0: all)
// and, where the program takes them (ExampleFlagSet):
//   --max-steps S stop after S optimizer steps in all (default 0: no cap; train_mnist_dp)
//   --double-buffering  (no value) data-parallel programs: the multi-node optimizer's double buffering
//
//   ExampleFlags flags;
//   flags.ranks = 2;                                     // the program's defaults
//   if (std::optional<int> exit = parse_example_flags(argc, argv, "train_x", "Trains x.", flags))
//     return *exit;

#include <cstdint>
#include <optional>
#include <string>

namespace cohort::examples {

struct ExampleFlags {
  std::string init;           // empty: start `ranks` local ranks
  std::string kind = "flat";  // communicator kind
  int ranks = 1;              // local ranks to start when init is empty
  int epochs = 1;             // passes over the training set
  int64_t limit = 0;          // > 0: first `limit` samples only
  int64_t max_steps = 0;      // > 0: stop after this many optimizer steps in all
  // MultiNodeOptimizerOptions::double_buffering, for the data-parallel programs.
  bool double_buffering = false;
  // --ranks' processes: none, core or auto (worker/base/cpu_binding.h); COHORT_CPU_BIND too.
  std::string cpu_bind = "none";
};

// The optional flags a program takes besides the five every example has.
struct ExampleFlagSet {
  bool max_steps = false;         // --max-steps S
  bool double_buffering = false;  // --double-buffering
};

// Parses argv into `flags` (which holds the program's defaults, shown in --help). std::nullopt:
// go on. Otherwise the program's exit status, with the output written: 0 after --help or
// --version, 2 after "<program>: <error>" on stderr (an unknown flag, a missing or bad value).
std::optional<int> parse_example_flags(int argc, char** argv, const std::string& program,
                                       const std::string& description, ExampleFlags& flags,
                                       ExampleFlagSet set = {});

}  // namespace cohort::examples
