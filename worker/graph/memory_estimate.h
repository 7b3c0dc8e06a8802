#pragma once

// A rough, deliberately simple estimate of the memory one rank of a job needs, from the spec alone
// (no libtorch): float32 parameters with their gradients and optimizer state, plus the activations
// of one batch kept for the backward pass. The coordinator compares it with the nodes' memory at
// submit time, so a job that cannot fit (a 2-billion-unit linear layer) is refused before it
// starts rather than swapping a node to a halt. It undercounts framework overhead and
// overcounts nothing, so a refusal is never a false alarm.
//
//   StatusOr<int64_t> bytes = cohort::graph::estimate_rank_memory_bytes(spec);
//
// Pure function; thread-safe. Sums saturate at INT64_MAX instead of overflowing.

#include <cstdint>

#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"

namespace cohort::graph {

// Bytes per parameter and per activation value: cohort trains in float32.
inline constexpr int64_t kBytesPerValue = 4;

// The largest per-rank estimate over the job's ranks (data parallel: every rank holds the graph;
// model parallel: the rank with the heaviest stages). Layers whose shapes cannot be inferred add
// their parameters only (validate_model reports them). Never fails on a spec that passed
// validation; INVALID_ARGUMENT when no model is set.
StatusOr<int64_t> estimate_rank_memory_bytes(const cohort::v1::JobSpec& spec);

}  // namespace cohort::graph
