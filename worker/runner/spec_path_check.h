#pragma once

// The worker's own check of the paths in its job spec (checkpoint.dir, dataset.path,
// model_parallel.stages[i].torchscript_file): the coordinator checked them lexically at submit;
// here, on the node that will open them, symlinks are resolved too, and the spec is rewritten to
// the resolved absolute paths, so what training opens is what was checked. A relative
// checkpoint.dir lands in the job's own directory.
//
// The agent passes the policy in the environment (COHORT_JOB_DIR, COHORT_ALLOWED_PATH_ROOTS). A
// worker started by another launcher (mpirun, a shell loop) runs the user's own spec as the user,
// and has neither: it checks nothing.
//
//   if (auto confinement = spec_path_confinement_from_environment())
//     COHORT_RETURN_IF_ERROR(confine_spec_paths(spec, *confinement));

#include <optional>

#include "cohort/v1/job.pb.h"
#include "worker/base/path_confinement.h"
#include "worker/base/status.h"

namespace cohort::worker {

// The policy from COHORT_JOB_DIR and COHORT_ALLOWED_PATH_ROOTS (':'-joined), with symlinks
// resolved; nullopt when neither is set. Reads the environment; thread-safe if nobody sets it.
std::optional<PathConfinement> spec_path_confinement_from_environment();

// Rewrites every spec path to its confined, resolved form; INVALID_ARGUMENT naming each path
// outside the roots (the spec is left unchanged then). Reads the file system (symlinks).
Status confine_spec_paths(cohort::v1::JobSpec& spec, const PathConfinement& confinement);

}  // namespace cohort::worker
