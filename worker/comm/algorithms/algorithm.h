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
};
inline constexpr int kNumAlgorithms = 7;

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

// "auto", "ring", "halving_doubling", "recursive_doubling", "binomial", "pairwise", "linear".
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
