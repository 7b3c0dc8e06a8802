#pragma once

// Structural validation of a JobSpec at submit time, before anything is queued: the checks the
// coordinator can make from the spec alone (counts, names, the communicator kind, dataset and model
// presence, model-parallel stage ranks and wiring). Layer-level checks — unknown layer types,
// shapes that do not fit — need the layer zoo's shape inference and belong to worker/graph; the
// gRPC adapter runs both.
//
// Every problem is reported, not only the first, each naming the field path and its value:
//   "nodes is 0; it must be at least 1; communicator 'ring' is not a communicator kind (...)".

#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

// Communicator kinds by ChainerMN's names, as worker/comm builds them.
inline constexpr const char* kCommunicatorKinds[] = {"naive",           "flat",        "hierarchical",
                                                     "two_dimensional", "single_node", "pure_nccl"};

// OK, or INVALID_ARGUMENT listing every problem. Pure function; thread-safe.
Status validate_job_spec(const cohort::v1::JobSpec& spec);

}  // namespace cohort::coordinator
