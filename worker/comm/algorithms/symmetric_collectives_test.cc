// Collectives where every rank plays the same part — allgatherv (ring), reduce_scatter (ring),
// alltoallv (pairwise), barrier (dissemination) — on every rank count, with uneven per-rank
// sizes including zeros, against serial references.

#include <atomic>
#include <numeric>
#include <thread>

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

// Per-rank sizes: uniform small, uneven with zeros (every third rank empty), and a large total
// split evenly (2^20+3 over the ranks).
std::vector<std::vector<size_t>> layouts(int size, size_t large_total) {
  std::vector<std::vector<size_t>> result;
  for (size_t n : kSmallCounts) result.push_back(std::vector<size_t>(size, n));
  std::vector<size_t> uneven(size);
  for (int rank = 0; rank < size; ++rank)
    uneven[rank] = rank % 3 == 1 ? 0 : static_cast<size_t>(rank) * 301 + 7;
  result.push_back(uneven);
  std::vector<size_t> large(size);
  for (int rank = 0; rank < size; ++rank) large[rank] = even_block(large_total, size, rank).size;
  result.push_back(large);
  return result;
}

size_t sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

// ---- allgatherv ----

class AllgatherTest : public ::testing::TestWithParam<std::tuple<Algorithm, int>> {};

TEST_P(AllgatherTest, EveryRankGetsEveryBlockInRankOrder) {
  const auto [algorithm, size] = GetParam();
  for (const auto& bytes : layouts(size, kLargeCount)) {
    for (bool in_place : {false, true}) {
      const size_t total = sum(bytes);
      const auto offsets = prefix_offsets(bytes);
      SCOPED_TRACE(fmt::format("ranks={} total={} block0={} in_place={}", size, total, bytes[0], in_place));
      std::vector<std::vector<uint8_t>> sends;
      std::vector<uint8_t> expected;
      for (int rank = 0; rank < size; ++rank) {
        sends.push_back(testing::pattern_bytes(rank, bytes[rank], 3));
        expected.insert(expected.end(), sends.back().begin(), sends.back().end());
      }
      std::vector<std::vector<uint8_t>> recvs(size, std::vector<uint8_t>(total, 0xee));
      if (in_place) {
        for (int rank = 0; rank < size; ++rank) {
          std::copy(sends[rank].begin(), sends[rank].end(), recvs[rank].begin() + offsets[rank]);
        }
      }
      auto run = testing::run_collective(size, [&](CollectiveContext& ctx) {
        const int rank = ctx.rank();
        const void* send = in_place ? recvs[rank].data() + offsets[rank] : sends[rank].data();
        return run_allgatherv(ctx, send, recvs[rank].data(), bytes, algorithm);
      });
      ASSERT_EQ(run.failures(), "");
      for (int rank = 0; rank < size; ++rank) {
        ASSERT_EQ(testing::compare_bytes(recvs[rank].data(), expected.data(), total), "") << "rank " << rank;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllgatherTest,
                         ::testing::Combine(::testing::Values(Algorithm::kRing, Algorithm::kAuto),
                                            ::testing::ValuesIn(kRankCounts)),
                         [](const auto& info) {
                           return testing::case_name(std::get<0>(info.param), std::get<1>(info.param));
                         });

// ---- reduce_scatter ----

class ReduceScatterTest : public ::testing::TestWithParam<std::tuple<Algorithm, int>> {
 protected:
  void check(const std::vector<size_t>& counts, DataType dtype, ReduceOp op) {
    const auto [algorithm, size] = GetParam();
    const size_t total = sum(counts);
    const auto offsets = prefix_offsets(counts);
    SCOPED_TRACE(fmt::format("{} ranks={} total={} block0={} {} {}", algorithm_name(algorithm), size, total,
                             counts[0], data_type_name(dtype), reduce_op_name(op)));
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<std::vector<uint8_t>> outs;
    for (int rank = 0; rank < size; ++rank) {
      buffers.push_back(testing::reduction_input(dtype, op, rank, total));
      outs.emplace_back(counts[rank] * element_size(dtype), 0xee);
    }
    auto run = testing::run_collective(size, [&](CollectiveContext& ctx) {
      const int rank = ctx.rank();
      return run_reduce_scatter(ctx, buffers[rank].data(), outs[rank].data(), counts, dtype, op, algorithm);
    });
    ASSERT_EQ(run.failures(), "");
    for (int rank = 0; rank < size; ++rank) {
      const auto expected = testing::reduction_reference(dtype, op, size, offsets[rank], counts[rank]);
      ASSERT_EQ(testing::compare_elements(outs[rank].data(), expected.data(), counts[rank], dtype), "")
          << "rank " << rank;
    }
  }
};

TEST_P(ReduceScatterTest, EveryTypeAndOpWithUnevenBlocks) {
  const int size = std::get<1>(GetParam());
  auto all = layouts(size, 0);
  all.pop_back();  // the large layout runs in LargeCount
  for (const auto& counts : all) {
    for (DataType dtype : kAllDataTypes) {
      for (ReduceOp op : kReduceOps) {
        check(counts, dtype, op);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(ReduceScatterTest, LargeCount) {
  const int size = std::get<1>(GetParam());
  const int index = testing::rank_count_index(size);
  const auto counts = layouts(size, kLargeCount).back();
  check(counts, kAllDataTypes[index % 8], kReduceOps[index % 4]);
  if (HasFatalFailure()) return;
  check(counts, kAllDataTypes[(index + 6) % 8], kReduceOps[(index + 1) % 4]);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ReduceScatterTest,
                         ::testing::Combine(::testing::Values(Algorithm::kRing, Algorithm::kAuto),
                                            ::testing::ValuesIn(kRankCounts)),
                         [](const auto& info) {
                           return testing::case_name(std::get<0>(info.param), std::get<1>(info.param));
                         });

// ---- alltoallv ----

class AlltoallTest : public ::testing::TestWithParam<std::tuple<Algorithm, int>> {};

// Bytes rank `from` sends to rank `to` in layout `kind`: 0 uniform `n`, 1 uneven with zeros.
size_t pair_bytes(int kind, size_t n, int from, int to) {
  if (kind == 0) return n;
  return (from * 3 + to * 5) % 4 == 0 ? 0 : static_cast<size_t>(from + 1) * 97 + static_cast<size_t>(to) * 13;
}

TEST_P(AlltoallTest, EveryRankGetsItsBlockFromEveryRank) {
  const auto [algorithm, size] = GetParam();
  std::vector<std::pair<int, size_t>> cases;
  for (size_t n : kSmallCounts) cases.push_back({0, n});
  cases.push_back({1, 0});
  cases.push_back({0, kLargeCount / static_cast<size_t>(size * size) + 1});
  for (auto [kind, n] : cases) {
    SCOPED_TRACE(fmt::format("ranks={} kind={} n={}", size, kind, n));
    std::vector<std::vector<size_t>> send_bytes(size, std::vector<size_t>(size));
    std::vector<std::vector<size_t>> recv_bytes(size, std::vector<size_t>(size));
    for (int from = 0; from < size; ++from) {
      for (int to = 0; to < size; ++to) {
        send_bytes[from][to] = recv_bytes[to][from] = pair_bytes(kind, n, from, to);
      }
    }
    std::vector<std::vector<uint8_t>> sends, recvs;
    for (int rank = 0; rank < size; ++rank) {
      sends.push_back(testing::pattern_bytes(rank, sum(send_bytes[rank]), 9));
      recvs.emplace_back(sum(recv_bytes[rank]), 0xee);
    }
    auto run = testing::run_collective(size, [&](CollectiveContext& ctx) {
      const int rank = ctx.rank();
      return run_alltoallv(ctx, sends[rank].data(), send_bytes[rank], recvs[rank].data(), recv_bytes[rank],
                           algorithm);
    });
    ASSERT_EQ(run.failures(), "");
    for (int to = 0; to < size; ++to) {
      const auto recv_offsets = prefix_offsets(recv_bytes[to]);
      for (int from = 0; from < size; ++from) {
        const auto send_offsets = prefix_offsets(send_bytes[from]);
        ASSERT_EQ(testing::compare_bytes(recvs[to].data() + recv_offsets[from],
                                         sends[from].data() + send_offsets[to], recv_bytes[to][from]),
                  "")
            << "block from rank " << from << " at rank " << to;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AlltoallTest,
                         ::testing::Combine(::testing::Values(Algorithm::kPairwise, Algorithm::kAuto),
                                            ::testing::ValuesIn(kRankCounts)),
                         [](const auto& info) {
                           return testing::case_name(std::get<0>(info.param), std::get<1>(info.param));
                         });

// ---- barrier ----

class BarrierTest : public ::testing::TestWithParam<int> {};

TEST_P(BarrierTest, NoRankLeavesBeforeEveryRankArrived) {
  const int size = GetParam();
  for (int round = 0; round < 3; ++round) {
    std::atomic<int> arrived{0};
    std::vector<int> seen_on_exit(size, -1);
    auto run = testing::run_collective(size, [&](CollectiveContext& ctx) {
      // Stagger arrivals so that early ranks really have to wait.
      std::this_thread::sleep_for(std::chrono::milliseconds(((ctx.rank() + round) % size) * 5));
      arrived.fetch_add(1);
      Status status = run_barrier(ctx);
      seen_on_exit[ctx.rank()] = arrived.load();
      return status;
    });
    ASSERT_EQ(run.failures(), "");
    for (int rank = 0; rank < size; ++rank) EXPECT_EQ(seen_on_exit[rank], size) << "rank " << rank;
    if (size == 1) {
      EXPECT_EQ(run.transfers_posted, 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(RankCounts, BarrierTest, ::testing::ValuesIn(kRankCounts),
                         [](const auto& info) { return fmt::format("{}ranks", info.param); });

}  // namespace
}  // namespace cohort::comm
