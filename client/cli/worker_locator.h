#pragma once

// Finds the cohort-worker binary `cohort run` starts, in this order:
//   1. --worker PATH
//   2. $COHORT_WORKER
//   3. cohort-worker next to the running cohort binary (an installed bin/ directory)
//   4. <dir of cohort>/../worker/runner/cohort-worker (Bazel's bazel-bin layout: client/cohort,
//   worker/runner/cohort-worker)
//   5. cohort-worker on $PATH
// The first executable file wins; the error names every place looked.

#include <string>
#include <vector>

#include "worker/base/status.h"

namespace cohort::client::cli {

inline constexpr const char* kWorkerBinaryName = "cohort-worker";

struct WorkerSearch {
  std::string flag;          // --worker, empty when not given
  std::string env;           // $COHORT_WORKER, empty when unset
  std::string program_path;  // the running cohort binary (/proc/self/exe), empty when unknown
  std::string path_env;      // $PATH
};

// The search of this process: its /proc/self/exe, $COHORT_WORKER and $PATH, with `flag`.
WorkerSearch worker_search_from_environment(const std::string& flag, const std::string& program_path);

// The worker's absolute path. NOT_FOUND listing every candidate and why it was rejected, and how to
// point at a worker. Blocking (stat calls).
StatusOr<std::string> locate_worker(const WorkerSearch& search);

}  // namespace cohort::client::cli
