#include "worker/runner/device_selection.h"

#include <gtest/gtest.h>

#include "worker/comm/transport/nccl/device_memory.h"

namespace cohort::worker {
namespace {

DeviceEnvironment gpus(int64_t count) {
  DeviceEnvironment environment;
  environment.cuda_built = true;
  environment.comm_cuda_built = true;
  environment.cuda_device_count = count;
  return environment;
}

TEST(SelectDevice, NoGpusRequestedTrainsOnTheCpu) {
  for (int64_t requested : {0, -1}) {
    StatusOr<c10::Device> device = select_device(requested, DeviceEnvironment{});
    ASSERT_TRUE(device.ok()) << device.status().to_string();
    EXPECT_TRUE(device->is_cpu());
  }
  // Even where GPUs exist: the job did not ask for one.
  EXPECT_TRUE(select_device(0, gpus(4)).value().is_cpu());
}

TEST(SelectDevice, GpusWithACpuOnlyLibtorchNameTheFix) {
  StatusOr<c10::Device> device = select_device(2, DeviceEnvironment{});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kFailedPrecondition);
  const std::string text = device.status().to_string();
  EXPECT_NE(text.find("asks for 2 GPU(s) per rank"), std::string::npos) << text;
  EXPECT_NE(text.find("libtorch has no CUDA"), std::string::npos) << text;
  EXPECT_NE(text.find("--repo_env=COHORT_LIBTORCH=<a CUDA libtorch> --config=cuda"), std::string::npos)
      << text;
  EXPECT_NE(text.find("gpus_per_proc: 0"), std::string::npos) << text;
}

TEST(SelectDevice, GpusWithACpuOnlyCohortBuildNameTheFix) {
  DeviceEnvironment environment = gpus(1);
  environment.comm_cuda_built = false;
  StatusOr<c10::Device> device = select_device(1, environment);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(device.status().to_string().find("built without --config=cuda"), std::string::npos)
      << device.status().to_string();
}

TEST(SelectDevice, GpusWithNoneVisibleIsAnError) {
  StatusOr<c10::Device> device = select_device(1, gpus(0));
  ASSERT_FALSE(device.ok());
  EXPECT_NE(device.status().to_string().find("no GPU is visible"), std::string::npos);
}

TEST(SelectDevice, TheAgentsVisibleDevicesMakeIndexZeroTheRanksGpu) {
  DeviceEnvironment environment = gpus(2);
  environment.cuda_visible_devices = "6,7";
  environment.local_rank = "3";
  EXPECT_EQ(select_device(2, environment).value(), c10::Device(c10::kCUDA, 0));
}

TEST(SelectDevice, WithoutVisibleDevicesTheLocalRankPicksTheGpu) {
  DeviceEnvironment environment = gpus(4);
  EXPECT_EQ(select_device(1, environment).value(), c10::Device(c10::kCUDA, 0));  // LOCAL_RANK unset
  environment.local_rank = "5";
  EXPECT_EQ(select_device(1, environment).value(), c10::Device(c10::kCUDA, 1));
  environment.local_rank = "x";
  EXPECT_EQ(select_device(1, environment).status().code(), StatusCode::kInvalidArgument);
}

TEST(SelectDevice, ThisBuildsEnvironmentIsConsistent) {
  DeviceEnvironment environment = DeviceEnvironment::current();
  if (!environment.cuda_built) {
    EXPECT_EQ(environment.cuda_device_count, 0);
  }
  EXPECT_EQ(environment.comm_cuda_built, comm::cuda_build());
  EXPECT_GE(environment.cuda_device_count, 0);
}

TEST(DefaultCommunicator, NcclOnCudaFlatOnTheCpu) {
  EXPECT_EQ(default_communicator(c10::Device(c10::kCUDA, 0)), "pure_nccl");
  EXPECT_EQ(default_communicator(c10::Device(c10::kCPU)), "flat");
}

}  // namespace
}  // namespace cohort::worker
