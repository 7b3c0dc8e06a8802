#pragma once

// The collective test matrix: every op × dtype × reduce op × size against closed-form references,
// run by every rank of a communicator. Shared by the loopback and UCX communicator tests.

#include <vector>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"

namespace cohort::comm::testing {

// The element counts of the matrix: {0, 1, 7, 1000, 2^20 + 3}.
const std::vector<size_t>& matrix_sizes();

// Runs the whole matrix on `comm` (every rank must call it). Returns the first wrong element or
// failed operation, naming op, dtype, reduce op, count and index.
Status run_collective_matrix(Communicator& comm, const std::vector<size_t>& sizes);

// A short allreduce check used per communicator kind: SUM, AVG, MAX over f32/i64/f16.
Status check_allreduce(Communicator& comm, size_t count);

}  // namespace cohort::comm::testing
