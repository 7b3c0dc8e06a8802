#pragma once

// Splitting a dataset among the ranks of a communicator (ChainerMN's scatter_dataset and
// scatter_index). The root alone decides the order — the identity, or a permutation — and the
// other ranks receive their part from it, so only the root needs the data.
//
//   TensorDataset all = rank == 0 ? read_fashion_mnist(true).value() : TensorDataset{};
//   TensorDataset mine = scatter_dataset(all, *comm, /*root=*/0, /*shuffle=*/true, /*seed=*/42).value();
//
// Seeds, as ChainerMN's `seed=None`: with shuffle and no seed (the default) the root draws a
// fresh permutation each run (from std::random_device); a seed gives the same permutation every
// run, on every platform. Without shuffle the order is the identity and the seed is unused.
//
// Datasets: a TensorDataset, or any Dataset (dataset.h: size() + get(i)) read at the root only,
// sample by sample; either way every rank receives its part as a TensorDataset.
//
// Partition of n samples over p ranks (ChainerMN's): rank i gets positions
// [n·i/p, n·(i+1)/p) of the order, so sizes differ by at most one and every sample is used
// exactly once. With force_equal_length every rank gets ceil(n/p) positions starting at n·i/p;
// positions past the end wrap around to the start of the order (a few samples repeat), so every
// rank runs the same number of iterations per epoch.

#include <cstdint>
#include <optional>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"
#include "worker/train/dataset.h"
#include "worker/train/tensor_dataset.h"

namespace cohort::train {

// The [begin, end) positions of the order that `rank` of `size` ranks gets for `n` samples
// (end may exceed n with force_equal_length: position j means order[j % n]). Pure; for tests
// and for callers that partition without communication.
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
};
IndexRange scatter_range(int64_t n, int size, int rank, bool force_equal_length);

// The order the root uses: 0..n-1, or a permutation of it drawn from `seed` (a portable
// Fisher–Yates over std::mt19937_64, so the same seed gives the same order on every platform).
std::vector<int64_t> scatter_order(int64_t n, bool shuffle, uint64_t seed);

// The seed of a shuffle: `seed` when given, else a fresh one from std::random_device.
uint64_t seed_or_fresh(const std::optional<uint64_t>& seed);

// The dataset indices of this rank. `n` is read at the root only (the root broadcasts it), and
// so is `seed` (std::nullopt: a fresh order each call). Collective over `comm`; blocking, within
// the communicator's timeout.
StatusOr<std::vector<int64_t>> scatter_index(int64_t n, comm::Communicator& comm, int root = 0,
                                             bool shuffle = false, std::optional<uint64_t> seed = std::nullopt,
                                             bool force_equal_length = true);

// This rank's part of `dataset`, copied (inputs and targets keep their dtypes and per-sample
// shapes). `dataset` is read at the root only; other ranks may pass an empty one. The root's
// dataset may live on the CPU or on a CUDA device; every rank's part is on the CPU. Collective
// over `comm`; blocking. Errors (INVALID_ARGUMENT on every rank at once): a bad root; undefined
// root tensors or inputs and targets of different lengths; dtypes the communicator cannot carry.
// Communication failures come back as the communicator's status.
StatusOr<TensorDataset> scatter_dataset(const TensorDataset& dataset, comm::Communicator& comm, int root = 0,
                                        bool shuffle = false, std::optional<uint64_t> seed = std::nullopt,
                                        bool force_equal_length = true);

// The same over a Dataset read at the root: `dataset` may be null off the root. The root calls
// get(i) for each index it sends and stacks the samples, so every sample must have the dtypes
// and shapes of the first one. A dataset of no samples gives every rank an empty TensorDataset
// (inputs float [0], targets int64 [0]). Errors as above, plus (INVALID_ARGUMENT on every rank)
// a null dataset at the root, a get() that throws, samples whose dtypes or shapes differ.
StatusOr<TensorDataset> scatter_dataset(const Dataset* dataset, comm::Communicator& comm, int root = 0,
                                        bool shuffle = false, std::optional<uint64_t> seed = std::nullopt,
                                        bool force_equal_length = true);

// ChainerMN's create_empty_dataset: a dataset of as many samples as `like` whose every sample is
// empty (inputs and targets of per-sample shape [0], with like's dtypes), for ranks that take
// part in training but have no input of their own (e.g. the later stages of a model split across
// ranks, whose forward starts with a recv): iterating it takes the same number of iterations per
// epoch as iterating `like`, so every rank calls the collectives of a step equally often.
// (A dataset of no samples at all, the earlier behaviour, is like.slice(0, 0).)
TensorDataset create_empty_dataset(const TensorDataset& like);
// The same for a Dataset: `like.size()` empty samples (inputs float, targets int64).
TensorDataset create_empty_dataset(const Dataset& like);

}  // namespace cohort::train
