#include "worker/comm/algorithms/algorithm_selector.h"

#include <cstdlib>

namespace cohort::comm {

AlgorithmSelector::AlgorithmSelector(AlgorithmSelectorOptions options) : options_(std::move(options)) {
  if (options_.read_environment_once && !options_.environment_variable.empty()) {
    const char* value = std::getenv(options_.environment_variable.c_str());
    cached_environment_ = value != nullptr ? std::string(value) : std::string();
  }
}

std::optional<std::string> AlgorithmSelector::environment_value() const {
  if (cached_environment_) return cached_environment_;
  const char* value = std::getenv(options_.environment_variable.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

StatusOr<Algorithm> AlgorithmSelector::select(Collective collective, size_t bytes, int ranks,
                                              Algorithm forced) const {
  // shm / ucx choose the path (the communicator acts on them); over the transport, the algorithm
  // stays the selector's.
  if (is_path_choice(forced)) forced = Algorithm::kAuto;
  if (forced != Algorithm::kAuto) {
    COHORT_RETURN_IF_ERROR(check_implements(collective, forced));
    return forced;
  }
  if (!options_.environment_variable.empty()) {
    std::optional<std::string> value = environment_value();
    if (value && !value->empty()) {
      StatusOr<Algorithm> from_environment = parse_algorithm(*value);
      if (!from_environment.ok()) {
        return from_environment.status().with_context(options_.environment_variable);
      }
      if (*from_environment != Algorithm::kAuto && !is_path_choice(*from_environment) &&
          implements(collective, *from_environment)) {
        return *from_environment;
      }
    }
  }
  return by_size(collective, bytes, ranks);
}

bool AlgorithmSelector::prefer_shared_memory(Collective /*collective*/, size_t bytes, int ranks) const {
  return ranks >= 2 && bytes <= options_.shared_memory_max_bytes;
}

Algorithm AlgorithmSelector::by_size(Collective collective, size_t bytes, int ranks) const {
  switch (collective) {
    case Collective::kAllreduce: {
      if (bytes <= options_.allreduce_recursive_doubling_max_bytes) return Algorithm::kRecursiveDoubling;
      const bool power_of_two = ranks > 0 && (ranks & (ranks - 1)) == 0;
      const size_t halving_doubling_max = power_of_two ? options_.allreduce_halving_doubling_max_bytes
                                                       : options_.allreduce_folded_halving_doubling_max_bytes;
      return bytes <= halving_doubling_max ? Algorithm::kHalvingDoubling : Algorithm::kRing;
    }
    case Collective::kReduce:
    case Collective::kBroadcast:
      return Algorithm::kBinomialTree;
    case Collective::kAllgather:
    case Collective::kReduceScatter:
      return Algorithm::kRing;
    case Collective::kGather:
    case Collective::kScatter:
      return Algorithm::kLinear;
    case Collective::kAlltoall:
      return Algorithm::kPairwise;
    case Collective::kBarrier:
      return Algorithm::kAuto;  // not selectable: dissemination
  }
  return Algorithm::kAuto;
}

}  // namespace cohort::comm
