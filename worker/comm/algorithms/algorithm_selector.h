#pragma once

// AlgorithmSelector: which algorithm runs a collective, by message size and rank count.
//
// Order of precedence: an algorithm forced by the caller (communicator option, benchmark flag)
// — an error if it does not implement the collective; then the COHORT_ALGO environment variable
// (one algorithm name for the whole process; it applies to the collectives that implement it
// and the others choose as usual); then the size rules below.
//
// allreduce, n bytes over P ranks (per-message cost α ≈ a few µs over UCX shared memory, copy
// and reduction cost β per byte):
//   n ≤ 16 KiB                       recursive doubling: log2(P) steps, the fewest; at this size
//                                    α dominates and sending the whole buffer each step is free.
//   n ≤ 1 MiB (P a power of two)     halving-doubling: bandwidth-optimal 2(P-1)/P·n bytes in
//   n ≤ 256 KiB (otherwise)          2·log2(P) steps. The fold of a non-power-of-two group adds
//                                    two full-buffer transfers, so the ring takes over earlier.
//   larger                           ring: the same bytes in 2(P-1) steps, but pipelined in
//                                    segments so every link and the reduction stay busy.
// reduce, broadcast: binomial tree (pipelined in segments); allgather(v), reduce_scatter: ring;
// alltoall(v): pairwise exchange; gather(v), scatter(v): linear; barrier: dissemination.
//
// Path (intra-node): when every rank of a communicator is on one node and in different processes,
// the communicator runs collectives through the shared-memory engine (worker/comm/shm) instead of
// any transport algorithm: no message at all, each byte copied in once and out once. prefer_
// shared_memory() is that rule; "shm" / "ucx" (forced, or COHORT_ALGO) pick the path outright,
// and a forced transport algorithm (e.g. "ring") keeps the collectives it implements on the
// transport.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "worker/base/status.h"
#include "worker/comm/algorithms/algorithm.h"

namespace cohort::comm {

inline constexpr char kAlgorithmEnvironmentVariable[] = "COHORT_ALGO";

struct AlgorithmSelectorOptions {
  // allreduce of at most this many bytes uses recursive doubling.
  size_t allreduce_recursive_doubling_max_bytes = 16 * 1024;
  // allreduce of at most this many bytes on a power-of-two group uses halving-doubling.
  size_t allreduce_halving_doubling_max_bytes = 1024 * 1024;
  // The same bound for other group sizes, where halving-doubling pays for the fold.
  size_t allreduce_folded_halving_doubling_max_bytes = 256 * 1024;
  // Collectives of ranks on one node move through shared memory up to this many bytes (per rank,
  // as select() counts them); larger ones too by default: the engine pipelines in cache-sized
  // chunks, so it has no size where the transport wins.
  size_t shared_memory_max_bytes = SIZE_MAX;
  // Environment variable that can override kAuto; empty to ignore the environment.
  std::string environment_variable = kAlgorithmEnvironmentVariable;
  // Read the environment variable once, at construction, instead of on every select(): for the
  // process-wide selector on the collective hot path (getenv scans the whole environment).
  bool read_environment_once = false;
};

class AlgorithmSelector {
 public:
  explicit AlgorithmSelector(AlgorithmSelectorOptions options = {});

  // The algorithm for `collective` moving `bytes` (per rank, as the collective's size is
  // usually quoted: the buffer of an allreduce, the total of an allgather) over `ranks` ranks.
  // Never returns kAuto, except for kBarrier (one algorithm, nothing to choose). Errors: a forced algorithm
  // that does not implement the collective, or an unparsable environment variable (INVALID_ARGUMENT).
  // Thread-safe.
  StatusOr<Algorithm> select(Collective collective, size_t bytes, int ranks,
                             Algorithm forced = Algorithm::kAuto) const;

  // The intra-node path rule: true when `collective` of `bytes` among `ranks` ranks that share a
  // node should run on shared memory. Sizes must be the same on every rank (v-collectives pass 0).
  bool prefer_shared_memory(Collective collective, size_t bytes, int ranks) const;

  // The size rules alone (no forcing, no environment).
  Algorithm by_size(Collective collective, size_t bytes, int ranks) const;

  const AlgorithmSelectorOptions& options() const { return options_; }

 private:
  // The environment variable's value: read now, or on every select() when not cached.
  std::optional<std::string> environment_value() const;

  AlgorithmSelectorOptions options_;
  std::optional<std::string> cached_environment_;  // set when read_environment_once
};

}  // namespace cohort::comm
