#include "worker/comm/algorithms/algorithm.h"

#include <cctype>
#include <string>

namespace cohort::comm {

std::string_view algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kHalvingDoubling:
      return "halving_doubling";
    case Algorithm::kRecursiveDoubling:
      return "recursive_doubling";
    case Algorithm::kBinomialTree:
      return "binomial";
    case Algorithm::kPairwise:
      return "pairwise";
    case Algorithm::kLinear:
      return "linear";
    case Algorithm::kShm:
      return "shm";
    case Algorithm::kTransport:
      return "ucx";
  }
  return "?";
}

std::string_view collective_name(Collective collective) {
  switch (collective) {
    case Collective::kAllreduce:
      return "allreduce";
    case Collective::kReduce:
      return "reduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kAllgather:
      return "allgather";
    case Collective::kGather:
      return "gather";
    case Collective::kScatter:
      return "scatter";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAlltoall:
      return "alltoall";
    case Collective::kBarrier:
      return "barrier";
  }
  return "?";
}

StatusOr<Algorithm> parse_algorithm(std::string_view name) {
  std::string normalized;
  for (char c : name)
    normalized += c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  struct Alias {
    std::string_view name;
    Algorithm algorithm;
  };
  static constexpr Alias kAliases[] = {
      {"auto", Algorithm::kAuto},
      {"ring", Algorithm::kRing},
      {"halving_doubling", Algorithm::kHalvingDoubling},
      {"rhd", Algorithm::kHalvingDoubling},
      {"recursive_halving_doubling", Algorithm::kHalvingDoubling},
      {"rabenseifner", Algorithm::kHalvingDoubling},
      {"recursive_doubling", Algorithm::kRecursiveDoubling},
      {"rd", Algorithm::kRecursiveDoubling},
      {"binomial", Algorithm::kBinomialTree},
      {"binomial_tree", Algorithm::kBinomialTree},
      {"tree", Algorithm::kBinomialTree},
      {"pairwise", Algorithm::kPairwise},
      {"linear", Algorithm::kLinear},
      {"shm", Algorithm::kShm},
      {"shared_memory", Algorithm::kShm},
      {"ucx", Algorithm::kTransport},
      {"transport", Algorithm::kTransport},
  };
  for (const Alias& alias : kAliases) {
    if (alias.name == normalized) return alias.algorithm;
  }
  return invalid_argument_error(
      "unknown collective algorithm '{}' (expected one of auto, ring, rhd / halving_doubling, "
      "recursive_doubling, "
      "binomial, pairwise, linear, shm, ucx)",
      name);
}

bool implements(Collective collective, Algorithm algorithm) {
  if (algorithm == Algorithm::kAuto || is_path_choice(algorithm)) return true;
  switch (collective) {
    case Collective::kAllreduce:
      return algorithm == Algorithm::kRing || algorithm == Algorithm::kHalvingDoubling ||
             algorithm == Algorithm::kRecursiveDoubling || algorithm == Algorithm::kLinear;
    case Collective::kReduce:
    case Collective::kBroadcast:
      return algorithm == Algorithm::kBinomialTree || algorithm == Algorithm::kLinear;
    case Collective::kAllgather:
    case Collective::kReduceScatter:
      return algorithm == Algorithm::kRing;
    case Collective::kGather:
    case Collective::kScatter:
      return algorithm == Algorithm::kLinear;
    case Collective::kAlltoall:
      return algorithm == Algorithm::kPairwise;
    case Collective::kBarrier:
      return false;  // one algorithm (dissemination), chosen without a selector
  }
  return false;
}

Status check_implements(Collective collective, Algorithm algorithm) {
  if (implements(collective, algorithm)) return ok_status();
  std::string available;
  for (int i = 1; i < kNumAlgorithms; ++i) {
    auto candidate = static_cast<Algorithm>(i);
    if (is_path_choice(candidate) || !implements(collective, candidate)) continue;
    if (!available.empty()) available += ", ";
    available += algorithm_name(candidate);
  }
  if (available.empty()) available = "none to choose from: use auto";
  return invalid_argument_error("{} has no '{}' algorithm (available: {})", collective_name(collective),
                                algorithm_name(algorithm), available);
}

}  // namespace cohort::comm
