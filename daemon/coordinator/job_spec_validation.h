#pragma once

// Structural validation of a JobSpec at submit time, before anything is queued: the checks the
// coordinator can make from the spec alone (counts, names, the communicator kind, dataset and model
// presence, model-parallel stage ranks and wiring). Layer-level checks — unknown layer types,
// shapes that do not fit — need the layer zoo's shape inference and belong to worker/graph; the
// gRPC adapter runs both.
//
// Every problem is reported, not only the first, each naming the field path and its value:
//   "nodes is 0; it must be at least 1; communicator 'ring' is not a communicator kind (...)".

#include <string>
#include <vector>

#include "cohort/v1/job.pb.h"
#include "worker/base/path_confinement.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

// Communicator kinds by ChainerMN's names, as worker/comm builds them.
inline constexpr const char* kCommunicatorKinds[] = {"naive",           "flat",        "hierarchical",
                                                     "two_dimensional", "single_node", "pure_nccl"};

struct JobSpecValidationOptions {
  // Roots (besides the job's own directory) that checkpoint.dir, dataset.path and
  // torchscript_file may lie under: the daemon config's allowed_path_roots. Checked lexically here
  // (the agents' file systems are not visible); the worker checks again with symlinks resolved.
  std::vector<std::string> allowed_path_roots = {kDefaultAllowedPathRoot};
};

// OK when checkpoint.dir, dataset.path and every torchscript_file lie under the allowed roots
// (validate_job_spec includes this); INVALID_ARGUMENT listing the paths that do not. Callers that
// look at the files a spec names (does the dataset exist?) check this first, so that the answer
// never tells whether a path outside the roots exists. Pure function; thread-safe.
Status validate_spec_paths(const cohort::v1::JobSpec& spec, const JobSpecValidationOptions& options = {});

// OK, or INVALID_ARGUMENT listing every problem. Pure function; thread-safe.
Status validate_job_spec(const cohort::v1::JobSpec& spec, const JobSpecValidationOptions& options = {});

}  // namespace cohort::coordinator
