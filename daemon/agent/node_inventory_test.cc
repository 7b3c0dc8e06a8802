#include "daemon/agent/node_inventory.h"

#include <gtest/gtest.h>

namespace cohort::agent {
namespace {

TEST(NodeInventoryTest, ProbesThisMachine) {
  auto inventory = probe_node_inventory();
  ASSERT_TRUE(inventory.ok()) << inventory.status().to_string();
  EXPECT_GE(inventory->cores, 1);
  EXPECT_GT(inventory->memory_bytes, 0);
  EXPECT_FALSE(inventory->hostname.empty());
  for (const GpuDevice& gpu : inventory->gpus) {
    EXPECT_FALSE(gpu.model.empty());
    EXPECT_GT(gpu.memory_bytes, 0);
  }
}

TEST(NodeInventoryTest, ParsesMeminfo) {
  auto total = parse_meminfo_total("MemTotal:       16303412 kB\nMemFree:         1234 kB\n");
  ASSERT_TRUE(total.ok());
  EXPECT_EQ(*total, 16303412LL * 1024);
  EXPECT_FALSE(parse_meminfo_total("MemFree: 1 kB\n").ok());
}

TEST(NodeInventoryTest, ParsesNvidiaSmiCsvAndSkipsJunk) {
  std::vector<GpuDevice> gpus = parse_nvidia_smi_gpus(
      "NVIDIA H100 80GB HBM3, 81559\n"
      "garbage\n"
      "Tesla T4, 15360\n"
      "\n");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[0].model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(gpus[0].memory_bytes, 81559LL * 1024 * 1024);
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_EQ(gpus[1].model, "Tesla T4");
  EXPECT_TRUE(parse_nvidia_smi_gpus("").empty());
}

TEST(NodeInventoryTest, CountsAtLeastOneCore) { EXPECT_GE(available_cores(), 1); }

}  // namespace
}  // namespace cohort::agent
