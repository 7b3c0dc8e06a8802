// run_allreduce with every allreduce algorithm forced (and auto), on every rank count, against a
// serial reference: all dtypes × SUM/PROD/MIN/MAX at small counts, and 2^20+3 elements for a
// rotating subset of dtypes and ops (every dtype is covered at that size by every algorithm
// across the rank counts).

#include <gtest/gtest.h>

#include "worker/comm/algorithms/chunking.h"
#include "worker/comm/algorithms/collective_test_harness.h"
#include "worker/comm/algorithms/collectives.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/comm/transport/loopback/loopback_transport.h"

namespace cohort::comm {
namespace {

using testing::kAllDataTypes;
using testing::kLargeCount;
using testing::kRankCounts;
using testing::kReduceOps;
using testing::kSmallCounts;

class AllreduceTest : public ::testing::TestWithParam<std::tuple<Algorithm, int>> {
 protected:
  void check(size_t count, DataType dtype, ReduceOp op) {
    const auto [algorithm, size] = GetParam();
    SCOPED_TRACE(fmt::format("{} ranks={} count={} {} {}", algorithm_name(algorithm), size, count,
                             data_type_name(dtype), reduce_op_name(op)));
    std::vector<std::vector<uint8_t>> buffers;
    for (int rank = 0; rank < size; ++rank)
      buffers.push_back(testing::reduction_input(dtype, op, rank, count));
    const std::vector<uint8_t> expected = testing::reduction_reference(dtype, op, size, 0, count);
    testing::RunResult run = testing::run_collective(size, [&](CollectiveContext& ctx) {
      return run_allreduce(ctx, buffers[ctx.rank()].data(), count, dtype, op, algorithm);
    });
    ASSERT_EQ(run.failures(), "");
    for (int rank = 0; rank < size; ++rank) {
      ASSERT_EQ(testing::compare_elements(buffers[rank].data(), expected.data(), count, dtype), "")
          << "rank " << rank;
    }
    if (size == 1 || count == 0) {
      EXPECT_EQ(run.transfers_posted, 0u);
    }
  }
};

TEST_P(AllreduceTest, EveryTypeAndOpAtSmallCounts) {
  for (size_t count : kSmallCounts) {
    for (DataType dtype : kAllDataTypes) {
      for (ReduceOp op : kReduceOps) {
        check(count, dtype, op);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(AllreduceTest, LargeCountPipelined) {
  const int index = testing::rank_count_index(std::get<1>(GetParam()));
  // Rank-count index i covers dtypes i and i+6 (mod 8): all 8 over the 6 rank counts.
  check(kLargeCount, kAllDataTypes[index % 8], kReduceOps[index % 4]);
  if (HasFatalFailure()) return;
  check(kLargeCount, kAllDataTypes[(index + 6) % 8], kReduceOps[(index + 1) % 4]);
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, AllreduceTest,
    ::testing::Combine(::testing::Values(Algorithm::kRing, Algorithm::kHalvingDoubling,
                                         Algorithm::kRecursiveDoubling, Algorithm::kLinear, Algorithm::kAuto),
                       ::testing::ValuesIn(kRankCounts)),
    [](const auto& info) { return testing::case_name(std::get<0>(info.param), std::get<1>(info.param)); });

// Sizes around the pipeline's segment boundaries, where the ring's per-block segment count and
// the exchange's slot reuse change: ring and halving-doubling on a non-power-of-two group.
TEST(AllreduceSegmentsTest, SizesAroundSegmentBoundaries) {
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling}) {
    // f32 over 3 ranks: blocks just under one minimum segment, just over two, just over the
    // target split of a maximum-size block, and many segments beyond the receive window.
    const size_t per_rank_segment = kMinSegmentBytes / sizeof(float);
    const size_t per_rank_max = kMaxSegmentBytes / sizeof(float);
    for (size_t count :
         {3 * per_rank_segment - 1, 3 * 2 * per_rank_segment + 1,
          3 * per_rank_max * kTargetSegmentsPerBlock + 5, 3 * per_rank_max * kPipelineDepth * 3 + 17}) {
      const int size = 3;
      const DataType dtype = DataType::kFloat32;
      const ReduceOp op = ReduceOp::kSum;
      SCOPED_TRACE(fmt::format("{} count={}", algorithm_name(algorithm), count));
      std::vector<std::vector<uint8_t>> buffers;
      for (int rank = 0; rank < size; ++rank)
        buffers.push_back(testing::reduction_input(dtype, op, rank, count));
      const auto expected = testing::reduction_reference(dtype, op, size, 0, count);
      auto run = testing::run_collective(size, [&](CollectiveContext& ctx) {
        return run_allreduce(ctx, buffers[ctx.rank()].data(), count, dtype, op, algorithm);
      });
      ASSERT_EQ(run.failures(), "");
      for (int rank = 0; rank < size; ++rank) {
        ASSERT_EQ(testing::compare_elements(buffers[rank].data(), expected.data(), count, dtype), "");
      }
    }
  }
}

// Back-to-back collectives, each with its own context and sequence number, sharing one scratch
// buffer per rank as a communicator does (it grows, shrinks in use, and is reused).
TEST(AllreduceSequenceTest, ConsecutiveCollectivesShareScratch) {
  const int size = 4;
  auto fabric = std::make_shared<LoopbackFabric>(size);
  std::vector<std::unique_ptr<Transport>> transports;
  for (int rank = 0; rank < size; ++rank) transports.push_back(fabric->transport(rank));
  const std::vector<int> ranks = {0, 1, 2, 3};
  const std::vector<size_t> counts = {1000000, 5, 300000, 70000};
  auto statuses = testing::run_ranks(size, [&](int rank) -> Status {
    std::vector<uint8_t> scratch;
    for (size_t sequence = 0; sequence < counts.size(); ++sequence) {
      const size_t count = counts[sequence];
      const DataType dtype = DataType::kBFloat16;
      auto buf = testing::reduction_input(dtype, ReduceOp::kMax, rank, count);
      CollectiveContext ctx(transports[rank].get(), &ranks, rank, collective_tag_base(0, sequence),
                            Deadline::after(testing::kTestDeadline), "allreduce", &scratch);
      COHORT_RETURN_IF_ERROR(run_allreduce(ctx, buf.data(), count, dtype, ReduceOp::kMax));
      auto expected = testing::reduction_reference(dtype, ReduceOp::kMax, size, 0, count);
      std::string diff = testing::compare_elements(buf.data(), expected.data(), count, dtype);
      if (!diff.empty()) return internal_error("count {}: {}", count, diff);
    }
    return ok_status();
  });
  EXPECT_EQ(testing::failures(statuses), "");
}

}  // namespace
}  // namespace cohort::comm
