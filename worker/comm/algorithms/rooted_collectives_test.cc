// Rooted collectives — reduce (binomial, linear), broadcast (binomial, linear), gatherv and
// scatterv (linear) — on every rank count, with roots other than 0, against serial references.

#include <numeric>

#include <gtest/gtest.h>

#include "worker/comm/algorithms/chunking.h"
#include "worker/comm/algorithms/collective_test_harness.h"
#include "worker/comm/algorithms/collectives.h"

namespace cohort::comm {
namespace {

using testing::kAllDataTypes;
using testing::kLargeCount;
using testing::kRankCounts;
using testing::kReduceOps;
using testing::kSmallCounts;

// Roots: the last rank, a middle one and 0 (deduplicated).
std::vector<int> roots_for(int size) {
  std::vector<int> roots = {size - 1};
  if (size / 2 != size - 1 && size / 2 != 0) roots.push_back(size / 2);
  if (size > 1) roots.push_back(0);
  return roots;
}

// Per-rank byte counts for the v-collectives: uniform, or uneven with zeros (every third rank
// empty, others different sizes).
std::vector<std::vector<size_t>> byte_layouts(int size) {
  std::vector<std::vector<size_t>> layouts;
  for (size_t bytes : kSmallCounts) layouts.push_back(std::vector<size_t>(size, bytes));
  std::vector<size_t> uneven(size);
  for (int rank = 0; rank < size; ++rank)
    uneven[rank] = rank % 3 == 1 ? 0 : static_cast<size_t>(rank) * 517 + 3;
  layouts.push_back(uneven);
  std::vector<size_t> large(size);
  for (int rank = 0; rank < size; ++rank) large[rank] = even_block(kLargeCount, size, rank).size;
  layouts.push_back(large);
  return layouts;
}

// ---- reduce ----

class ReduceTest : public ::testing::TestWithParam<std::tuple<Algorithm, int>> {
 protected:
  void check(size_t count, DataType dtype, ReduceOp op, int root) {
    const auto [algorithm, size] = GetParam();
    SCOPED_TRACE(fmt::format("{} ranks={} root={} count={} {} {}", algorithm_name(algorithm), size, root,
                             count, data_type_name(dtype), reduce_op_name(op)));
    std::vector<std::vector<uint8_t>> buffers;
    for (int rank = 0; rank < size; ++rank)
      buffers.push_back(testing::reduction_input(dtype, op, rank, count));
    const auto expected = testing::reduction_reference(dtype, op, size, 0, count);
    auto run = testing::run_collective(size, [&](CollectiveContext& ctx) {
      return run_reduce(ctx, buffers[ctx.rank()].data(), count, dtype, op, root, algorithm);
    });
    ASSERT_EQ(run.failures(), "");
    ASSERT_EQ(testing::compare_elements(buffers[root].data(), expected.data(), count, dtype), "");
  }
};

TEST_P(ReduceTest, EveryTypeAndOpAtSmallCountsForSeveralRoots) {
  const int size = std::get<1>(GetParam());
  for (int root : roots_for(size)) {
    for (size_t count : kSmallCounts) {
      for (DataType dtype : kAllDataTypes) {
        for (ReduceOp op : kReduceOps) {
          check(count, dtype, op, root);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_P(ReduceTest, LargeCount) {
  const int size = std::get<1>(GetParam());
  const int index = testing::rank_count_index(size);
  check(kLargeCount, kAllDataTypes[index % 8], kReduceOps[index % 4], size - 1);
  if (HasFatalFailure()) return;
  check(kLargeCount, kAllDataTypes[(index + 6) % 8], kReduceOps[(index + 1) % 4], size / 2);
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, ReduceTest,
    ::testing::Combine(::testing::Values(Algorithm::kBinomialTree, Algorithm::kLinear, Algorithm::kAuto),
                       ::testing::ValuesIn(kRankCounts)),
    [](const auto& info) { return testing::case_name(std::get<0>(info.param), std::get<1>(info.param)); });

// ---- broadcast ----

class BroadcastTest : public ::testing::TestWithParam<std::tuple<Algorithm, int>> {};

TEST_P(BroadcastTest, EveryRankGetsTheRootsBytes) {
  const auto [algorithm, size] = GetParam();
  for (int root : roots_for(size)) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, kLargeCount}) {
      SCOPED_TRACE(fmt::format("{} ranks={} root={} bytes={}", algorithm_name(algorithm), size, root, bytes));
      std::vector<std::vector<uint8_t>> buffers;
      for (int rank = 0; rank < size; ++rank) buffers.push_back(testing::pattern_bytes(rank, bytes));
      const auto expected = buffers[root];
      auto run = testing::run_collective(size, [&](CollectiveContext& ctx) {
        return run_broadcast(ctx, buffers[ctx.rank()].data(), bytes, root, algorithm);
      });
      ASSERT_EQ(run.failures(), "");
      for (int rank = 0; rank < size; ++rank) {
        ASSERT_EQ(testing::compare_bytes(buffers[rank].data(), expected.data(), bytes), "")
            << "rank " << rank;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, BroadcastTest,
    ::testing::Combine(::testing::Values(Algorithm::kBinomialTree, Algorithm::kLinear, Algorithm::kAuto),
                       ::testing::ValuesIn(kRankCounts)),
    [](const auto& info) { return testing::case_name(std::get<0>(info.param), std::get<1>(info.param)); });

// ---- gatherv / scatterv ----

class GatherScatterTest : public ::testing::TestWithParam<std::tuple<Algorithm, int>> {};

TEST_P(GatherScatterTest, GathervConcatenatesBlocksAtTheRoot) {
  const auto [algorithm, size] = GetParam();
  for (int root : roots_for(size)) {
    for (const auto& bytes : byte_layouts(size)) {
      for (bool in_place : {false, true}) {
        const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
        const auto offsets = prefix_offsets(bytes);
        SCOPED_TRACE(fmt::format("ranks={} root={} total={} block0={} in_place={}", size, root, total,
                                 bytes[0], in_place));
        std::vector<std::vector<uint8_t>> sends;
        std::vector<uint8_t> expected;
        for (int rank = 0; rank < size; ++rank) {
          sends.push_back(testing::pattern_bytes(rank, bytes[rank]));
          expected.insert(expected.end(), sends.back().begin(), sends.back().end());
        }
        std::vector<uint8_t> recv(total, 0xee);
        if (in_place) std::copy(sends[root].begin(), sends[root].end(), recv.begin() + offsets[root]);
        auto run = testing::run_collective(size, [&](CollectiveContext& ctx) {
          const int rank = ctx.rank();
          const void* send = in_place && rank == root ? recv.data() + offsets[root] : sends[rank].data();
          return run_gatherv(ctx, send, rank == root ? recv.data() : nullptr, bytes, root, algorithm);
        });
        ASSERT_EQ(run.failures(), "");
        ASSERT_EQ(testing::compare_bytes(recv.data(), expected.data(), total), "");
      }
    }
  }
}

TEST_P(GatherScatterTest, ScattervDealsTheRootsBlocks) {
  const auto [algorithm, size] = GetParam();
  for (int root : roots_for(size)) {
    for (const auto& bytes : byte_layouts(size)) {
      const size_t total = std::accumulate(bytes.begin(), bytes.end(), size_t{0});
      const auto offsets = prefix_offsets(bytes);
      SCOPED_TRACE(fmt::format("ranks={} root={} total={} block0={}", size, root, total, bytes[0]));
      const std::vector<uint8_t> send = testing::pattern_bytes(root, total, 5);
      std::vector<std::vector<uint8_t>> recvs;
      for (int rank = 0; rank < size; ++rank) recvs.emplace_back(bytes[rank], 0xee);
      auto run = testing::run_collective(size, [&](CollectiveContext& ctx) {
        const int rank = ctx.rank();
        return run_scatterv(ctx, rank == root ? send.data() : nullptr, recvs[rank].data(), bytes, root,
                            algorithm);
      });
      ASSERT_EQ(run.failures(), "");
      for (int rank = 0; rank < size; ++rank) {
        ASSERT_EQ(testing::compare_bytes(recvs[rank].data(), send.data() + offsets[rank], bytes[rank]), "")
            << "rank " << rank;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, GatherScatterTest,
                         ::testing::Combine(::testing::Values(Algorithm::kLinear, Algorithm::kAuto),
                                            ::testing::ValuesIn(kRankCounts)),
                         [](const auto& info) {
                           return testing::case_name(std::get<0>(info.param), std::get<1>(info.param));
                         });

}  // namespace
}  // namespace cohort::comm
