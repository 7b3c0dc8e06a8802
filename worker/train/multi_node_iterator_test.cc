#include "worker/train/multi_node_iterator.h"

#include <algorithm>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/train/synthetic_dataset.h"

namespace cohort::train {
namespace {

template <typename Fn>
std::string run_on_ranks(int size, Fn fn) {
  auto worlds = comm::testing::loopback_worlds(size);
  comm::CommunicatorOptions options;
  options.timeout = std::chrono::seconds(10);
  return comm::testing::failures(comm::testing::run_ranks(size, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, comm::create_communicator("flat", worlds[rank], options));
    return fn(rank, *comm);
  }));
}

TensorDataset small_dataset() {
  SyntheticDatasetOptions options;
  options.size = 23;
  options.sample_shape = {2, 3};
  return make_synthetic_dataset(options);
}

bool same(const TensorDataset& a, const TensorDataset& b) {
  return a.inputs.scalar_type() == b.inputs.scalar_type() &&
         a.targets.scalar_type() == b.targets.scalar_type() && a.inputs.sizes() == b.inputs.sizes() &&
         a.targets.sizes() == b.targets.sizes() && at::equal(a.inputs, b.inputs) &&
         at::equal(a.targets, b.targets);
}

TEST(BatchIteratorTest, EpochsCoverEverySampleAndPositionsRestore) {
  TensorDataset data = small_dataset();
  BatchIterator it(data, 5, true, 3);
  std::vector<TensorDataset> first_epoch;
  while (auto batch = it.next()) first_epoch.push_back(*batch);
  ASSERT_EQ(first_epoch.size(), 5u);  // 5+5+5+5+3
  EXPECT_EQ(first_epoch.back().size(), 3);
  std::vector<int64_t> labels;
  for (const auto& b : first_epoch) {
    for (int64_t i = 0; i < b.size(); ++i) labels.push_back(b.targets[i].item<int64_t>());
  }
  std::vector<int64_t> all(data.targets.data_ptr<int64_t>(), data.targets.data_ptr<int64_t>() + data.size());
  std::sort(labels.begin(), labels.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(labels, all);

  // Epoch 1 in a different order; a copy restored at a position continues identically.
  auto second = it.next();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(it.position(), (IteratorPosition{1, 5}));
  EXPECT_FALSE(same(*second, first_epoch[0]));
  BatchIterator restored(data, 5, true, 3);
  restored.set_position(it.position());
  for (int i = 0; i < 6; ++i) {
    auto a = it.next(), b = restored.next();
    ASSERT_EQ(a.has_value(), b.has_value());
    if (a) {
      EXPECT_TRUE(same(*a, *b)) << "batch " << i;
    }
  }
}

// A position taken right after an epoch's nullopt restores to the next epoch's first batch, as
// the original continues (a checkpoint there must not replay the end of the epoch).
TEST(BatchIteratorTest, PositionAfterEpochEndRestoresToTheNextEpoch) {
  TensorDataset data = small_dataset();
  BatchIterator it(data, 10, true, 4);
  while (it.next()) {
  }
  EXPECT_EQ(it.position(), (IteratorPosition{1, 0}));
  BatchIterator restored(data, 10, true, 4);
  restored.set_position(it.position());
  for (int i = 0; i < 4; ++i) {
    auto a = it.next(), b = restored.next();
    ASSERT_EQ(a.has_value(), b.has_value()) << "call " << i;
    if (a) {
      EXPECT_TRUE(same(*a, *b)) << "call " << i;
    }
  }
}

// The root's batches arrive unchanged on every rank; nullopt ends the epoch everywhere.
TEST(MultiNodeIteratorTest, EveryRankGetsTheRootsBatches) {
  TensorDataset data = small_dataset();
  std::vector<TensorDataset> expected;
  BatchIterator reference(data, 4, true, 9);
  while (auto batch = reference.next()) expected.push_back(*batch);
  for (int size = 1; size <= 4; ++size) {
    int root = size - 1;
    std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      auto it = create_multi_node_iterator(rank == root ? data : TensorDataset{}, 4, comm, root, true, 9);
      for (size_t i = 0; i <= expected.size(); ++i) {
        COHORT_ASSIGN_OR_RETURN(auto batch, it->next());
        if (i == expected.size()) {
          if (batch.has_value()) return internal_error("rank {}: no end of epoch", rank);
        } else if (!batch.has_value() || !same(*batch, expected[i])) {
          return internal_error("rank {}: batch {} differs", rank, i);
        }
      }
      return ok_status();
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

// Ranks passing different seeds all follow the root's seed, without moving data.
TEST(SynchronizedIteratorTest, SameOrderOnEveryRank) {
  TensorDataset data = small_dataset();
  BatchIterator reference(data, 6, true, 100);
  std::vector<TensorDataset> expected;
  for (int i = 0; i < 10; ++i) {
    if (auto b = reference.next()) expected.push_back(*b);
  }
  for (int size = 1; size <= 4; ++size) {
    std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      COHORT_ASSIGN_OR_RETURN(auto it, create_synchronized_iterator(data, 6, comm, /*seed=*/100 + rank));
      size_t k = 0;
      for (int i = 0; i < 10; ++i) {
        auto batch = it->next();
        if (!batch) continue;
        if (!same(*batch, expected[k++])) return internal_error("rank {}: batch {} differs", rank, k - 1);
      }
      return ok_status();
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

}  // namespace
}  // namespace cohort::train
