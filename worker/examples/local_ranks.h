#pragma once

// Starting N ranks of an example on this machine (as cohort-bench -np N): the parent re-executes
// its own binary N times, each child with "--init file://DIR/store?rank=R&world_size=N" appended,
// waits for all of them and removes the store directory.
//
//   if (options.ranks > 0 && options.init.empty()) return run_local_ranks(argc, argv, options.ranks);
//
// A failed rank stops the others at once (they would only time out in their next collective).

#include "worker/base/cpu_binding.h"

namespace cohort::examples {

// Blocking until every child exits. Returns 0 when all exit 0, else 1. Fork/exec errors are
// printed to stderr and reported as 1. `bind`: each child is bound to its share of the CPUs
// before exec (worker/base/cpu_binding.h); the caller has checked that it can be.
int run_local_ranks(int argc, char** argv, int ranks, CpuBind bind = CpuBind::kNone);

}  // namespace cohort::examples
