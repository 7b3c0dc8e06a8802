#include "worker/train/scatter_dataset.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/train/multi_node_iterator.h"
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

// ChainerMN's create_empty_dataset: as many samples as the original, each empty, so a rank
// iterating it runs as many iterations per epoch as one iterating the original.
TEST(ScatterDatasetTest, EmptyDatasetKeepsTheLength) {
  SyntheticDatasetOptions options;
  options.size = 37;
  TensorDataset full = make_synthetic_dataset(options);
  TensorDataset empty = create_empty_dataset(full);
  ASSERT_EQ(empty.size(), 37);
  EXPECT_EQ(empty.targets.size(0), 37);
  EXPECT_EQ(empty.inputs.numel(), 0);
  EXPECT_EQ(empty.targets.numel(), 0);
  EXPECT_EQ(empty.inputs.scalar_type(), full.inputs.scalar_type());
  EXPECT_EQ(empty.targets.scalar_type(), at::kLong);
  EXPECT_EQ(empty.select(at::arange(3, at::kLong)).size(), 3);

  // A batch per 8 samples: 5 batches an epoch, on the original and on the empty dataset alike.
  auto batches = [](const TensorDataset& dataset) {
    BatchIterator it(dataset, 8, /*shuffle=*/true, 1);
    int count = 0;
    while (auto batch = it.next()) {
      EXPECT_EQ(batch->inputs.size(0), batch->targets.size(0));
      ++count;
    }
    return count;
  };
  EXPECT_EQ(batches(empty), 5);
  EXPECT_EQ(batches(full), 5);

  auto lazy = make_dataset(11, [](int64_t) { return Example{at::ones({2}), at::zeros({}, at::kLong)}; });
  EXPECT_EQ(create_empty_dataset(*lazy).size(), 11);
  EXPECT_EQ(create_empty_dataset(TensorDataset{}).size(), 0);
}

// Without a seed the root draws a fresh order per call (ChainerMN's seed=None); with one, the
// order is fixed. Two unseeded scatters of 64 samples agreeing by chance: 1/64!.
TEST(ScatterDatasetTest, MissingSeedGivesAFreshOrderAndASeedAFixedOne) {
  SyntheticDatasetOptions options;
  options.size = 64;
  options.sample_shape = {1};
  TensorDataset full = make_synthetic_dataset(options);
  full.targets = at::arange(64, at::kLong);  // the target names the sample
  auto scatter_targets = [&](int size, bool shuffle, std::optional<uint64_t> seed) {
    std::mutex mu;
    std::vector<int64_t> order;
    std::vector<std::vector<int64_t>> parts(size);
    std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      COHORT_ASSIGN_OR_RETURN(TensorDataset part,
                              scatter_dataset(rank == 0 ? full : TensorDataset{}, comm, 0, shuffle, seed, false));
      std::lock_guard<std::mutex> lock(mu);
      for (int64_t i = 0; i < part.size(); ++i) parts[rank].push_back(part.targets[i].item<int64_t>());
      return ok_status();
    });
    EXPECT_EQ(failures, "");
    for (const auto& part : parts) order.insert(order.end(), part.begin(), part.end());
    return order;
  };
  std::vector<int64_t> identity(64);
  for (int64_t i = 0; i < 64; ++i) identity[i] = i;
  for (int size : {1, 3}) {
    std::vector<int64_t> a = scatter_targets(size, true, std::nullopt);
    std::vector<int64_t> b = scatter_targets(size, true, std::nullopt);
    EXPECT_NE(a, b) << "size " << size << ": two unseeded shuffles gave the same order";
    EXPECT_NE(a, identity);
    std::vector<int64_t> sorted = a;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, identity) << "an unseeded shuffle is still a permutation";
    // A seed still gives the fixed order of scatter_order, run after run.
    EXPECT_EQ(scatter_targets(size, true, 42), scatter_order(64, true, 42));
    EXPECT_EQ(scatter_targets(size, true, 42), scatter_order(64, true, 42));
    EXPECT_EQ(scatter_targets(size, false, std::nullopt), identity);
  }
  // scatter_index follows the same rule.
  std::vector<std::vector<int64_t>> runs;
  for (int run = 0; run < 2; ++run) {
    std::vector<int64_t> mine;
    ASSERT_EQ(run_on_ranks(1,
                           [&](int, comm::Communicator& comm) -> Status {
                             COHORT_ASSIGN_OR_RETURN(mine, scatter_index(64, comm, 0, true));
                             return ok_status();
                           }),
              "");
    runs.push_back(mine);
  }
  EXPECT_NE(runs[0], runs[1]);
}

// A Dataset (size + get) read at the root only, sample by sample: every rank gets the samples the
// same scatter of the equivalent TensorDataset gives it.
TEST(ScatterDatasetTest, AcceptsAnyDatasetThroughTheInterface) {
  SyntheticDatasetOptions options;
  options.size = 17;
  options.sample_shape = {3};
  TensorDataset full = make_synthetic_dataset(options);
  for (int size : {1, 2, 3, 5}) {
    for (bool force_equal : {false, true}) {
      std::atomic<int> calls{0};
      auto lazy = make_dataset(17, [&](int64_t i) {
        ++calls;
        return Example{full.inputs[i], full.targets[i]};
      });
      std::mutex mu;
      std::vector<TensorDataset> want(size), got(size);
      std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
        const int root = size - 1;
        COHORT_ASSIGN_OR_RETURN(TensorDataset a,
                                scatter_dataset(rank == root ? lazy.get() : nullptr, comm, root, true, 5, force_equal));
        COHORT_ASSIGN_OR_RETURN(TensorDataset b,
                                scatter_dataset(rank == root ? full : TensorDataset{}, comm, root, true, 5, force_equal));
        std::lock_guard<std::mutex> lock(mu);
        got[rank] = a;
        want[rank] = b;
        return ok_status();
      });
      ASSERT_EQ(failures, "") << "size " << size;
      int64_t total = 0;
      for (int r = 0; r < size; ++r) {
        ASSERT_EQ(got[r].size(), want[r].size()) << "rank " << r;
        EXPECT_TRUE(got[r].inputs.equal(want[r].inputs)) << "rank " << r;
        EXPECT_TRUE(got[r].targets.equal(want[r].targets)) << "rank " << r;
        total += got[r].size();
      }
      EXPECT_EQ(calls.load(), total) << "get() is called at the root once per sample sent";
    }
  }
}

// A sample whose shape differs, a get() that throws and a null dataset at the root fail every
// rank with the root's reason.
TEST(ScatterDatasetTest, BadDatasetThroughTheInterfaceFailsEveryRank) {
  auto ragged = make_dataset(6, [](int64_t i) {
    return Example{at::ones({i == 4 ? 3 : 2}), at::zeros({}, at::kLong)};
  });
  auto throwing = make_dataset(6, [](int64_t i) -> Example {
    if (i == 2) throw std::runtime_error("disk on fire");
    return Example{at::ones({2}), at::zeros({}, at::kLong)};
  });
  std::string failures = run_on_ranks(3, [&](int rank, comm::Communicator& comm) -> Status {
    struct Case {
      const Dataset* dataset;
      const char* reason;
    };
    for (const Case& c : {Case{ragged.get(), "same dtypes and shapes"}, Case{throwing.get(), "disk on fire"},
                          Case{nullptr, "no dataset"}}) {
      auto got = scatter_dataset(rank == 0 ? c.dataset : nullptr, comm, 0, false);
      if (got.ok() || got.status().code() != StatusCode::kInvalidArgument ||
          got.status().message().find(c.reason) == std::string::npos) {
        return internal_error("rank {}: expected '{}', got {}", rank, c.reason, got.status().to_string());
      }
    }
    return ok_status();
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace cohort::train
