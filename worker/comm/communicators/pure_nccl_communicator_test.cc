// Every communicator kind either runs or says which build it needs. On a CPU-only build
// pure_nccl must fail with a message naming `bazel build --config=cuda`; on a CUDA build without
// a GPU it must say no device is visible. The GPU behaviour itself is tested in //tests/gpu.

#include <gtest/gtest.h>

#include <vector>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/comm/transport/nccl/device_memory.h"

namespace cohort::comm {
namespace {

using testing::failures;
using testing::loopback_worlds;
using testing::run_ranks;

constexpr int kRanks = 3;

TEST(CommunicatorKindsTest, EveryHostKindRunsAnAllreduce) {
  for (const std::string& kind : communicator_kinds()) {
    if (kind == "pure_nccl") continue;
    SCOPED_TRACE(kind);
    auto worlds = loopback_worlds(kRanks);
    auto statuses = run_ranks(kRanks, [&](int rank) -> Status {
      COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator(kind, worlds[rank]));
      std::vector<int32_t> values = {rank + 1, 10 * (rank + 1)};
      COHORT_RETURN_IF_ERROR(
          comm->allreduce(values.data(), values.data(), values.size(), DataType::kInt32, ReduceOp::kSum)
              ->wait());
      if (values != std::vector<int32_t>{6, 60}) {
        return internal_error("rank {}: got {} {}, expected 6 60", rank, values[0], values[1]);
      }
      return ok_status();
    });
    EXPECT_EQ(failures(statuses), "");
  }
}

TEST(CommunicatorKindsTest, PureNcclRunsOrNamesTheBuildOrDeviceItNeeds) {
  if (cuda_build() && cuda_device_count() > 0) {
    GTEST_SKIP() << "this CUDA build sees a GPU: pure_nccl runs, and //tests/gpu tests it";
  }
  auto worlds = loopback_worlds(1);
  auto comm = create_communicator("pure_nccl", worlds[0]);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kFailedPrecondition) << comm.status().to_string();
  if (cuda_build()) {
    EXPECT_NE(comm.status().message().find("no CUDA device is visible"), std::string::npos)
        << comm.status().to_string();
  } else {
    EXPECT_NE(comm.status().message().find("pure_nccl needs a CUDA build: bazel build --config=cuda"),
              std::string::npos)
        << comm.status().to_string();
  }
}

TEST(CommunicatorKindsTest, HostBuffersAreNeverTakenForDeviceMemory) {
  std::vector<float> host(4);
  EXPECT_FALSE(is_device_memory(host.data()));
  EXPECT_FALSE(is_device_memory(nullptr));
}

}  // namespace
}  // namespace cohort::comm
