#pragma once

// Splitting a dataset among the ranks of a communicator (ChainerMN's scatter_dataset and
// scatter_index). The root alone decides the order — the identity, or a permutation seeded by
// `seed` — and the other ranks receive their part from it, so only the root needs the data.
//
//   TensorDataset all = rank == 0 ? read_fashion_mnist(true).value() : TensorDataset{};
//   TensorDataset mine = scatter_dataset(all, *comm, /*root=*/0, /*shuffle=*/true, /*seed=*/42).value();
//
// Partition of n samples over p ranks (ChainerMN's): rank i gets positions
// [n·i/p, n·(i+1)/p) of the order, so sizes differ by at most one and every sample is used
// exactly once. With force_equal_length every rank gets ceil(n/p) positions starting at n·i/p;
// positions past the end wrap around to the start of the order (a few samples repeat), so every
// rank runs the same number of iterations per epoch.

#include <cstdint>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"
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

// The dataset indices of this rank. `n` is read at the root only (the root broadcasts it).
// Collective over `comm`; blocking, within the communicator's timeout.
StatusOr<std::vector<int64_t>> scatter_index(int64_t n, comm::Communicator& comm, int root = 0,
                                             bool shuffle = false, uint64_t seed = 0,
                                             bool force_equal_length = true);

// This rank's part of `dataset`, copied (inputs and targets keep their dtypes and per-sample
// shapes). `dataset` is read at the root only; other ranks may pass an empty one. The root's
// dataset may live on the CPU or on a CUDA device; every rank's part is on the CPU. Collective
// over `comm`; blocking. Errors (INVALID_ARGUMENT on every rank at once): a bad root; undefined
// root tensors or inputs and targets of different lengths; dtypes the communicator cannot carry.
// Communication failures come back as the communicator's status.
StatusOr<TensorDataset> scatter_dataset(const TensorDataset& dataset, comm::Communicator& comm, int root = 0,
                                        bool shuffle = false, uint64_t seed = 0,
                                        bool force_equal_length = true);

// A dataset of no samples (ChainerMN's create_empty_dataset): for ranks that take part in
// collectives but train on nothing. Keeps the per-sample shapes and dtypes of `like`.
TensorDataset create_empty_dataset(const TensorDataset& like);

}  // namespace cohort::train
