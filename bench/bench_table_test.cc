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
  EXPECT_EQ(sizes.back(), 32u << 20);  // 8 * 4^11 = 32 MiB; the next step would pass 64 MiB
  EXPECT_EQ(size_sweep(2, 16, 2, 4).front(), 4u);  // at least one element
}

}  // namespace
}  // namespace cohort::bench
