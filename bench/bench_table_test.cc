#include "bench/bench_table.h"

#include <gtest/gtest.h>

namespace cohort::bench {
namespace {

TEST(BenchTableTest, BusBandwidthFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("allreduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("allgather", 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("alltoall", 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("broadcast", 8), 1.0);
}

TEST(BenchTableTest, SizeSweepAndParsing) {
  size_t bytes = 0;
  ASSERT_TRUE(parse_size("64M", &bytes));
  EXPECT_EQ(bytes, 64u << 20);
  ASSERT_TRUE(parse_size("8", &bytes));
  EXPECT_EQ(bytes, 8u);
  EXPECT_FALSE(parse_size("lots", &bytes));
  auto sizes = size_sweep(8, 64u << 20, 4, 4);
  ASSERT_FALSE(sizes.empty());
  EXPECT_EQ(sizes.front(), 8u);
  EXPECT_EQ(sizes.back(), 32u << 20);              // 8 * 4^11 = 32 MiB; the next step would pass 64 MiB
  EXPECT_EQ(size_sweep(2, 16, 2, 4).front(), 4u);  // at least one element
}

TEST(BenchTableTest, SizeListRoundsLikeTheSweep) {
  std::vector<size_t> sizes;
  ASSERT_TRUE(parse_size_list("8,1K,64K,1M,16M,64M", 4, &sizes));
  EXPECT_EQ(sizes, (std::vector<size_t>{8, 1024, 64u << 10, 1u << 20, 16u << 20, 64u << 20}));
  ASSERT_TRUE(parse_size_list("8", 16, &sizes));  // reduce_scatter on 4 ranks: one float each
  EXPECT_EQ(sizes, std::vector<size_t>{16});
  EXPECT_FALSE(parse_size_list("8,,1K", 4, &sizes));
  EXPECT_FALSE(parse_size_list("", 4, &sizes));
  EXPECT_FALSE(parse_size_list("8,lots", 4, &sizes));
}

TEST(BenchTableTest, OpCountsMatchBetweenCohortAndPeers) {
  EXPECT_EQ(op_counts("allgather", 2, 4).send, 1u);  // at least one element per rank
  EXPECT_EQ(op_counts("allgather", 2, 4).recv, 4u);
  EXPECT_EQ(op_counts("allgather", 1024, 4).recv, 1024u);
  EXPECT_EQ(op_counts("reduce_scatter", 1024, 4).recv, 256u);
  EXPECT_EQ(op_counts("allreduce", 7, 3).send, 7u);
  EXPECT_EQ(block_multiple("reduce_scatter", 4), 4u);
  EXPECT_EQ(block_multiple("broadcast", 4), 1u);
}

TEST(BenchTableTest, OpNamesResolveToTheirOwnCall) {
  EXPECT_EQ(bench_op("allreduce"), BenchOp::kAllreduce);
  EXPECT_EQ(bench_op("broadcast"), BenchOp::kBroadcast);
  EXPECT_EQ(bench_op("reduce"), BenchOp::kReduce);
  EXPECT_EQ(bench_op("allgather"), BenchOp::kAllgather);
  EXPECT_EQ(bench_op("reduce_scatter"), BenchOp::kReduceScatter);
  EXPECT_EQ(bench_op("alltoall"), BenchOp::kAlltoall);
  EXPECT_EQ(bench_op("pingpong"), BenchOp::kPingpong);
}

}  // namespace
}  // namespace cohort::bench
