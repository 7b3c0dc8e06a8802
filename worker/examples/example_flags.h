#pragma once

// The flags every example (and bench/train_fashion_mnist) takes, parsed in one place:
//   --ranks N     start N local ranks (processes over a file:// store; see local_ranks.h)
//   --init URL    join a job: env://, tcp://host:port, file:///path?rank=R&world_size=N
//   --kind KIND   communicator kind (default flat)
//   --epochs E    passes over the training set (default 1)
//   --limit N     use only the first N training and test samples (default 0: all)
//   --max-steps S stop after S optimizer steps in all (default 0: no cap; train_mnist_dp)
//   --double-buffering  (no value) data-parallel programs: the multi-node optimizer's double buffering

#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
};

// Parses argv into `flags` (which holds the program's defaults). On an unknown flag or a missing
// value prints the error and `usage` to stderr and returns false.
inline bool parse_example_flags(int argc, char** argv, const char* usage, ExampleFlags& flags) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--double-buffering") {  // the one flag without a value
      flags.double_buffering = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n%s", argv[0], flag.c_str(), usage);
      return false;
    }
    const char* value = argv[++i];
    if (flag == "--init") {
      flags.init = value;
    } else if (flag == "--kind") {
      flags.kind = value;
    } else if (flag == "--ranks") {
      flags.ranks = std::atoi(value);
    } else if (flag == "--epochs") {
      flags.epochs = std::atoi(value);
    } else if (flag == "--limit") {
      flags.limit = std::atoll(value);
    } else if (flag == "--max-steps") {
      flags.max_steps = std::atoll(value);
    } else {
      std::fprintf(stderr, "%s: unknown flag %s\n%s", argv[0], flag.c_str(), usage);
      return false;
    }
  }
  return true;
}

}  // namespace cohort::examples
