#include "worker/train/scatter_dataset.h"

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

// Runs `fn(rank, comm)` on `size` loopback ranks with flat communicators.
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

TEST(ScatterRangeTest, PartitionsAndPads) {
  // 10 over 4: 2, 3, 2, 3 positions; equal length: 3 each from 0, 2, 5, 7 (the last wraps).
  EXPECT_EQ(scatter_range(10, 4, 0, false).end, 2);
  EXPECT_EQ(scatter_range(10, 4, 1, false).begin, 2);
  EXPECT_EQ(scatter_range(10, 4, 3, false).end, 10);
  EXPECT_EQ(scatter_range(10, 4, 3, true).begin, 7);
  EXPECT_EQ(scatter_range(10, 4, 3, true).end, 10);
  EXPECT_EQ(scatter_range(10, 4, 2, true).end, 8);
  EXPECT_EQ(scatter_range(0, 3, 2, true).end, scatter_range(0, 3, 2, true).begin);
}

TEST(ScatterOrderTest, ShuffleIsASeededPermutation) {
  auto a = scatter_order(100, true, 7), b = scatter_order(100, true, 7), c = scatter_order(100, true, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, scatter_order(100, false, 7));
  std::sort(a.begin(), a.end());
  EXPECT_EQ(a, scatter_order(100, false, 0));
}

// Every sample exactly once with force_equal_length=false, for sizes not divisible by the rank
// count; with force_equal_length every rank gets ceil(n/p) and every sample at least once.
TEST(ScatterIndexTest, CoversEverySampleExactlyOnce) {
  for (int size = 1; size <= 5; ++size) {
    for (int64_t n : {0, 1, 7, 13, 31}) {
      for (bool force_equal : {false, true}) {
        std::mutex mu;
        std::vector<std::vector<int64_t>> got(size);
        std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
          // Only the root's n counts: the others pass garbage.
          COHORT_ASSIGN_OR_RETURN(auto mine,
                                  scatter_index(rank == 0 ? n : -5, comm, 0, true, 42, force_equal));
          std::lock_guard<std::mutex> lock(mu);
          got[rank] = mine;
          return ok_status();
        });
        ASSERT_EQ(failures, "") << "size " << size << " n " << n;
        std::vector<int> seen(n, 0);
        for (int r = 0; r < size; ++r) {
          if (force_equal && n > 0) {
            EXPECT_EQ(static_cast<int64_t>(got[r].size()), (n + size - 1) / size);
          }
          for (int64_t i : got[r]) {
            ASSERT_GE(i, 0);
            ASSERT_LT(i, n);
            ++seen[i];
          }
        }
        for (int64_t i = 0; i < n; ++i) {
          if (force_equal) {
            EXPECT_GE(seen[i], 1) << "sample " << i << " size " << size << " n " << n;
          } else {
            EXPECT_EQ(seen[i], 1) << "sample " << i << " size " << size << " n " << n;
          }
        }
      }
    }
  }
}

TEST(ScatterDatasetTest, RanksGetTheRootsSamples) {
  for (int size : {1, 2, 3, 5}) {
    for (int root : {0, size - 1}) {
      SyntheticDatasetOptions options;
      options.size = 23;
      options.sample_shape = {2, 3};
      TensorDataset full = make_synthetic_dataset(options);
      std::mutex mu;
      std::vector<TensorDataset> parts(size);
      std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
        TensorDataset input = rank == root ? full : TensorDataset{};
        COHORT_ASSIGN_OR_RETURN(TensorDataset part, scatter_dataset(input, comm, root, true, 3, false));
        std::lock_guard<std::mutex> lock(mu);
        parts[rank] = part;
        return ok_status();
      });
      ASSERT_EQ(failures, "") << "size " << size;
      std::vector<int64_t> order = scatter_order(23, true, 3);
      int64_t total = 0;
      for (int r = 0; r < size; ++r) {
        IndexRange range = scatter_range(23, size, r, false);
        ASSERT_EQ(parts[r].size(), range.end - range.begin);
        EXPECT_EQ(parts[r].inputs.sizes().slice(1), full.inputs.sizes().slice(1));
        EXPECT_EQ(parts[r].targets.scalar_type(), at::kLong);
        for (int64_t j = range.begin; j < range.end; ++j) {
          EXPECT_TRUE(parts[r].inputs[j - range.begin].equal(full.inputs[order[j]]));
          EXPECT_EQ(parts[r].targets[j - range.begin].item<int64_t>(),
                    full.targets[order[j]].item<int64_t>());
        }
        total += parts[r].size();
      }
      EXPECT_EQ(total, 23);
    }
  }
}

TEST(ScatterDatasetTest, BadRootIsAnError) {
  std::string failures = run_on_ranks(2, [&](int, comm::Communicator& comm) -> Status {
    auto got = scatter_dataset(TensorDataset{}, comm, 2);
    if (got.ok() || got.status().code() != StatusCode::kInvalidArgument) {
      return internal_error("expected INVALID_ARGUMENT, got {}", got.status().to_string());
    }
    return ok_status();
  });
  EXPECT_EQ(failures, "");
}

// A bad dataset at the root fails every rank at once (no rank waits for data that never comes).
TEST(ScatterDatasetTest, BadRootDatasetFailsEveryRank) {
  TensorDataset bad = make_synthetic_dataset({});
  bad.targets = bad.targets.slice(0, 0, 10);
  std::string failures = run_on_ranks(3, [&](int rank, comm::Communicator& comm) -> Status {
    auto got = scatter_dataset(rank == 1 ? bad : TensorDataset{}, comm, 1);
    if (got.ok() || got.status().message().find("targets hold 10") == std::string::npos) {
      return internal_error("rank {}: expected the root's error, got {}", rank, got.status().to_string());
    }
    auto index = scatter_index(rank == 1 ? -3 : 5, comm, 1);
    if (index.ok() || index.status().code() != StatusCode::kInvalidArgument) {
      return internal_error("rank {}: expected INVALID_ARGUMENT, got {}", rank, index.status().to_string());
    }
    return ok_status();
  });
  EXPECT_EQ(failures, "");
}

TEST(ScatterDatasetTest, EmptyDatasetKeepsShapes) {
  TensorDataset full = make_synthetic_dataset({});
  TensorDataset empty = create_empty_dataset(full);
  EXPECT_EQ(empty.size(), 0);
  EXPECT_EQ(empty.inputs.sizes().slice(1), full.inputs.sizes().slice(1));
}

}  // namespace
}  // namespace cohort::train
