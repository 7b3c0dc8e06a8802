#pragma once

// The size sweep and timing flags that cohort-bench and its MPI peer share, so both binaries
// spell, default and check them alike (nccl-tests' -b/-e/-f, plus --sizes, -n and -w).

#include <cstddef>
#include <string>

#include <CLI/CLI.hpp>

namespace cohort::bench {

struct SweepOptions {
  size_t begin = 8, end = size_t{64} << 20, factor = 4;
  std::string sizes;  // --sizes: a comma-separated list replacing the -b/-e/-f sweep
  int iters = 20, warmup = 5;
};

// Declares -b, -e, -f, --sizes, -n/--iters and -w/--warmup on `app`, writing into `*sweep`.
// -b and -e are read as text ("64K") and converted by finish().
class SweepFlags {
 public:
  SweepFlags(CLI::App* app, SweepOptions* sweep);

  // After parsing: sets sweep->begin and ->end; "" or the usage error naming the flag and value.
  std::string finish() const;

 private:
  SweepOptions* sweep_;
  std::string begin_ = "8", end_ = "64M";
};

}  // namespace cohort::bench
