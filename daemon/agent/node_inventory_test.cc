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
    EXPECT_GE(gpu.memory_bytes, 0);  // 0 when only the driver's /proc files answered
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

TEST(NodeInventoryTest, ParsesTheIndexedQueryIncludingIndexesOutOfOrder) {
  std::vector<GpuDevice> gpus = parse_nvidia_smi_gpus(
      "0, NVIDIA H100 80GB HBM3, 81559\n"
      "3, NVIDIA A100-SXM4-40GB, 40960\n"
      "x, broken, line\n");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[0].model, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(gpus[1].index, 3);
  EXPECT_EQ(gpus[1].model, "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(gpus[1].memory_bytes, 40960LL * 1024 * 1024);
}

TEST(NodeInventoryTest, PrefersNvidiaSmiAndFallsBackToTheDriversProcFiles) {
  const std::string proc_a100 =
      "Model: \t\t NVIDIA A100-PCIE-40GB\nIRQ:   \t\t 132\nBus Location: \t 0000:3b:00.0\nDevice Minor: \t 0\n";
  const std::string proc_t4 = "Model: \t\t Tesla T4\nDevice Minor: \t 1\n";
  int smi_calls = 0;
  GpuProbeSources sources;
  sources.nvidia_smi = [&]() -> std::optional<std::string> {
    ++smi_calls;
    return std::string("0, NVIDIA A100-PCIE-40GB, 40960\n");
  };
  sources.proc_gpu_information = [&] { return std::vector<std::string>{proc_a100, proc_t4}; };
  std::vector<GpuDevice> gpus = probe_gpus(sources);
  EXPECT_EQ(smi_calls, 1);
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0].memory_bytes, 40960LL * 1024 * 1024);

  // nvidia-smi missing or failing: the /proc files, model only.
  sources.nvidia_smi = [] { return std::optional<std::string>(); };
  gpus = probe_gpus(sources);
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].index, 0);
  EXPECT_EQ(gpus[0].model, "NVIDIA A100-PCIE-40GB");
  EXPECT_EQ(gpus[0].memory_bytes, 0);
  EXPECT_EQ(gpus[1].index, 1);
  EXPECT_EQ(gpus[1].model, "Tesla T4");

  // Neither: no GPUs, no error.
  sources.proc_gpu_information = [] { return std::vector<std::string>{}; };
  EXPECT_TRUE(probe_gpus(sources).empty());
  EXPECT_EQ(parse_proc_gpu_model("IRQ: 5\n"), std::nullopt);
}

TEST(NodeInventoryTest, CountsAtLeastOneCore) { EXPECT_GE(available_cores(), 1); }

}  // namespace
}  // namespace cohort::agent
