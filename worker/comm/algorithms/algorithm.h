#pragma once

// The collective algorithms by name, the collectives they implement, and which one implements
// which. A communicator option or COHORT_ALGO forces one (benchmarks, tests); otherwise the
// AlgorithmSelector picks by size and rank count.

#include <cstdint>
#include <string_view>

#include "worker/base/status.h"

namespace cohort::comm {

enum class Algorithm : uint8_t {
  kAuto = 0,               // let the selector choose
  kRing = 1,               // AllreduceRing, AllgatherRing, ReduceScatterRing
  kHalvingDoubling = 2,    // AllreduceHalvingDoubling (Rabenseifner)
  kRecursiveDoubling = 3,  // AllreduceRecursiveDoubling
  kBinomialTree = 4,       // BroadcastBinomial, ReduceBinomial
  kPairwise = 5,           // AlltoallPairwise
  kLinear = 6,             // AllreduceLinear, ReduceLinear, BroadcastLinear, GatherLinear, ScatterLinear
  // Path choices rather than algorithms: every collective of ranks on one node through the
  // shared-memory engine (worker/comm/shm), or through the transport (UCX) with the selector's
  // algorithm. Both "implement" every collective; where the path does not apply (ranks on several
  // nodes) the selector's transport algorithm runs.
  kShm = 7,
  kTransport = 8,  // "ucx" / "transport"
};
inline constexpr int kNumAlgorithms = 9;

// True for kShm and kTransport: they choose a path, and the transport algorithm stays automatic.
inline bool is_path_choice(Algorithm algorithm) {
  return algorithm == Algorithm::kShm || algorithm == Algorithm::kTransport;
}

enum class Collective : uint8_t {
  kAllreduce,
  kReduce,
  kBroadcast,
  kAllgather,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
  kBarrier,
};

// "auto", "ring", "halving_doubling", "recursive_doubling", "binomial", "pairwise", "linear",
// "shm", "ucx".
std::string_view algorithm_name(Algorithm algorithm);
// "allreduce", "reduce", "broadcast", "allgather", "gather", "scatter", "reduce_scatter",
// "alltoall", "barrier".
std::string_view collective_name(Collective collective);

// Parses the names above case-insensitively ('-' reads as '_'), plus the aliases "rhd" /
// "rabenseifner" / "recursive_halving_doubling", "rd", "binomial_tree" / "tree".
StatusOr<Algorithm> parse_algorithm(std::string_view name);

// True when `algorithm` has an implementation of `collective`. kAuto implements everything.
bool implements(Collective collective, Algorithm algorithm);

// OK when implements(); otherwise INVALID_ARGUMENT naming both and listing the algorithms that do
// implement `collective`.
Status check_implements(Collective collective, Algorithm algorithm);

}  // namespace cohort::comm
