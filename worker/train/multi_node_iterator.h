#pragma once

// Batch iterators across ranks (ChainerMN's create_multi_node_iterator and
// create_synchronized_iterator), over the local BatchIterator they share.
//
//   // Every rank trains on the same batch, drawn at rank 0 (e.g. model parallelism):
//   auto it = create_multi_node_iterator(rank == 0 ? train : TensorDataset{}, 64, *comm, /*root=*/0);
//   while (auto batch = it->next().value()) step(*batch);   // one epoch
//
//   // Every rank walks its own copy of the data in the same shuffled order, no data traffic:
//   auto sync = create_synchronized_iterator(train, 64, *comm).value();   // broadcasts rank 0's seed
//
// Iterators are single-threaded: one training thread calls next().

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"
#include "worker/train/tensor_dataset.h"

namespace cohort::train {

// Where an iterator stands: the epoch and the number of samples of it already returned. Saved
// by the checkpointer so a resumed run continues with the next batch.
struct IteratorPosition {
  int64_t epoch = 0;
  int64_t offset = 0;
  friend bool operator==(const IteratorPosition& a, const IteratorPosition& b) {
    return a.epoch == b.epoch && a.offset == b.offset;
  }
};

// Local: batches of `batch_size` over one dataset, epoch after epoch. With shuffle, epoch e's
// order is scatter_order(n, true, epoch_seed(seed, e)) — a pure function of (seed, e), so any
// position can be restored without replaying. The last batch of an epoch may be short.
class BatchIterator {
 public:
  // batch_size < 1 is taken as 1.
  BatchIterator(TensorDataset dataset, int64_t batch_size, bool shuffle = true, uint64_t seed = 0);

  // The next batch of the current epoch (copied), or nullopt at its end — after which the next
  // call starts the following epoch. An empty dataset yields nullopt every time.
  std::optional<TensorDataset> next();

  // After next() has returned an epoch's nullopt, the start of the following epoch: restoring
  // it continues with that epoch's first batch, as this iterator would (not with a second
  // nullopt).
  IteratorPosition position() const { return at_end_ ? IteratorPosition{position_.epoch + 1, 0} : position_; }
  // Continues from `position` (as returned by position()).
  void set_position(const IteratorPosition& position);

  const TensorDataset& dataset() const { return dataset_; }
  uint64_t seed() const { return seed_; }

 private:
  void make_order();

  TensorDataset dataset_;
  int64_t batch_size_;
  bool shuffle_;
  uint64_t seed_;
  IteratorPosition position_;
  bool at_end_ = false;  // nullopt returned for this epoch; the next call starts the next one
  std::vector<int64_t> order_;
};

// The seed of epoch `epoch` (splitmix64 of both): distinct epochs get unrelated permutations.
uint64_t epoch_seed(uint64_t seed, int64_t epoch);

// The root draws each batch from its source and broadcasts it; every rank gets the same batch
// (dtypes, shapes and values), or nullopt on every rank when the root's source returns nullopt.
// The root's batch may be on the CPU or on a CUDA device: it travels through host memory and the
// root gets it back on its own device; the other ranks receive CPU tensors (move them to their
// device, as for any batch).
class MultiNodeIterator {
 public:
  using BatchSource = std::function<std::optional<TensorDataset>()>;

  // `source` is called at the root only (may be empty elsewhere). `comm` must outlive this. Local.
  MultiNodeIterator(BatchSource source, comm::Communicator& comm, int root = 0);

  // Collective and blocking: one bcast_obj of the batch's dtypes and shapes, then one broadcast
  // each of inputs and targets. Errors: the root's batch is neither on the CPU nor on CUDA, its
  // tensors are undefined or of a dtype the communicator cannot carry (INVALID_ARGUMENT on every
  // rank); the communicator's status otherwise.
  StatusOr<std::optional<TensorDataset>> next();

 private:
  BatchSource source_;
  comm::Communicator& comm_;
  int root_;
};

// ChainerMN's constructor, over a source drawn at the root.
std::unique_ptr<MultiNodeIterator> create_multi_node_iterator(MultiNodeIterator::BatchSource source,
                                                              comm::Communicator& comm, int root = 0);
// Over a dataset read at the root only: one epoch of BatchIterator(dataset, batch_size, shuffle,
// seed) per nullopt, as BatchIterator::next().
std::unique_ptr<MultiNodeIterator> create_multi_node_iterator(const TensorDataset& dataset,
                                                              int64_t batch_size, comm::Communicator& comm,
                                                              int root = 0, bool shuffle = true,
                                                              uint64_t seed = 0);

// A BatchIterator whose seed is `root`'s (one int64 broadcast, collective and blocking), so all
// ranks holding the same dataset draw the same samples in the same order with no data traffic.
StatusOr<std::unique_ptr<BatchIterator>> create_synchronized_iterator(TensorDataset dataset,
                                                                      int64_t batch_size,
                                                                      comm::Communicator& comm,
                                                                      uint64_t seed = 0, int root = 0);

}  // namespace cohort::train
