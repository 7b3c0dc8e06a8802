// Device buffers in every host kind, without a GPU: the FakeDeviceMemory seam makes memory it
// allocates count as device memory and routes the staging copies through counters, so the
// staging paths of all collectives and of point to point run here exactly as on a GPU machine
// (where tests/gpu runs the same checks on real device memory).

#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/device_collectives.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/comm/transport/nccl/device_memory.h"

namespace cohort::comm {
namespace {

using testing::failures;
using testing::loopback_worlds;
using testing::run_ranks;

// "Device" memory of the seam; its copies are plain memcpy and are not counted (only the
// communicator's staging copies are).
class FakeSpace final : public testing::BufferSpace {
 public:
  explicit FakeSpace(FakeDeviceMemory& memory) : memory_(memory) {}
  std::string name() const override { return "fake device"; }
  void* allocate(size_t bytes) override { return memory_.allocate(bytes); }
  Status upload(void* to, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(to, host, bytes);
    return ok_status();
  }
  Status download(void* host, const void* from, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, from, bytes);
    return ok_status();
  }

 private:
  FakeDeviceMemory& memory_;
};

// Simulated nodes each kind accepts at `size` ranks.
std::function<std::string(int)> layout(const std::string& kind, int size) {
  if (kind == "single_node") return testing::nodes_of(size);
  if (kind == "two_dimensional" && size % 2 != 0) return testing::nodes_of(1);
  return testing::nodes_of(2);
}

TEST(DeviceStagingTest, EveryHostKindStagesEveryCollectiveAndPointToPoint) {
  FakeDeviceMemory fake;
  for (const std::string& kind : communicator_kinds()) {
    if (kind == "pure_nccl") continue;
    for (int size : {1, 2, 3, 4}) {
      SCOPED_TRACE(kind + " x" + std::to_string(size));
      fake.reset_counters();
      auto worlds = loopback_worlds(size, layout(kind, size));
      auto statuses = run_ranks(size, [&](int rank) -> Status {
        COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator(kind, worlds[rank]));
        FakeSpace space(fake);
        for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64}) {
          COHORT_RETURN_IF_ERROR(testing::check_every_collective(*comm, space, dtype));
        }
        return ok_status();
      });
      EXPECT_EQ(failures(statuses), "");
      // Results equal to the host path's prove little alone (the "device" memory is host memory):
      // the copies prove the staging path ran.
      EXPECT_GT(fake.bytes_to_host(), 0u);
      EXPECT_GT(fake.bytes_to_device(), 0u);
    }
  }
}

// The staging copies are exactly the call's input in and output out, per rank.
TEST(DeviceStagingTest, StagingCopiesOnlyWhatEachRankReadsAndWrites) {
  FakeDeviceMemory fake;
  constexpr int kRanks = 3;
  constexpr size_t kCount = 100;
  auto worlds = loopback_worlds(kRanks);
  std::vector<std::unique_ptr<Communicator>> comms(kRanks);
  auto statuses = run_ranks(kRanks, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(comms[rank], create_communicator("flat", worlds[rank]));
    return ok_status();
  });
  ASSERT_EQ(failures(statuses), "");

  // allgather out of place: each rank stages its block in and the whole result out.
  statuses = run_ranks(kRanks, [&](int rank) -> Status {
    auto* send = static_cast<float*>(fake.allocate(kCount * sizeof(float)));
    auto* recv = static_cast<float*>(fake.allocate(kRanks * kCount * sizeof(float)));
    for (size_t i = 0; i < kCount; ++i) send[i] = static_cast<float>(rank);
    COHORT_RETURN_IF_ERROR(comms[rank]->allgather(send, recv, kCount, DataType::kFloat32)->wait());
    for (int r = 0; r < kRanks; ++r) {
      if (recv[r * kCount] != static_cast<float>(r))
        return internal_error("block {} holds {}", r, recv[r * kCount]);
    }
    return ok_status();
  });
  ASSERT_EQ(failures(statuses), "");
  EXPECT_EQ(fake.bytes_to_host(), kRanks * kCount * sizeof(float));
  EXPECT_EQ(fake.bytes_to_device(), kRanks * kRanks * kCount * sizeof(float));

  // broadcast: the root stages in only, the others out only.
  fake.reset_counters();
  statuses = run_ranks(kRanks, [&](int rank) -> Status {
    auto* buf = static_cast<float*>(fake.allocate(kCount * sizeof(float)));
    if (rank == 1) buf[kCount - 1] = 7.0f;
    COHORT_RETURN_IF_ERROR(comms[rank]->broadcast(buf, kCount, DataType::kFloat32, 1)->wait());
    return buf[kCount - 1] == 7.0f ? ok_status() : internal_error("rank {} got {}", rank, buf[kCount - 1]);
  });
  ASSERT_EQ(failures(statuses), "");
  EXPECT_EQ(fake.bytes_to_host(), kCount * sizeof(float));
  EXPECT_EQ(fake.bytes_to_device(), (kRanks - 1) * kCount * sizeof(float));

  // A host buffer in the call is never copied through the device path.
  fake.reset_counters();
  statuses = run_ranks(kRanks, [&](int rank) -> Status {
    std::vector<float> send(kCount, 1.0f);
    auto* recv = static_cast<float*>(fake.allocate(kCount * sizeof(float)));
    COHORT_RETURN_IF_ERROR(
        comms[rank]->allreduce(send.data(), recv, kCount, DataType::kFloat32, ReduceOp::kSum)->wait());
    return recv[0] == kRanks ? ok_status() : internal_error("rank {} got {}", rank, recv[0]);
  });
  ASSERT_EQ(failures(statuses), "");
  EXPECT_EQ(fake.bytes_to_host(), 0u);
  EXPECT_EQ(fake.bytes_to_device(), kRanks * kCount * sizeof(float));
}

// A staged receive reaches the device buffer when the transfer is seen complete, by wait() or by
// polling is_completed().
TEST(DeviceStagingTest, AStagedReceiveIsCopiedToTheDeviceWhenPolledComplete) {
  FakeDeviceMemory fake;
  auto worlds = loopback_worlds(2);
  auto statuses = run_ranks(2, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("naive", worlds[rank]));
    auto* buf = static_cast<int32_t*>(fake.allocate(4 * sizeof(int32_t)));
    if (rank == 0) {
      for (int i = 0; i < 4; ++i) buf[i] = 10 + i;
      return comm->send(buf, 4, DataType::kInt32, 1, 3);
    }
    auto work = comm->irecv(buf, 4, DataType::kInt32, 0, 3);
    Deadline deadline = Deadline::after(std::chrono::seconds(30));
    while (!work->is_completed()) {
      if (deadline.expired()) return deadline_exceeded_error("the receive never completed");
      std::this_thread::yield();
    }
    COHORT_RETURN_IF_ERROR(work->error());
    for (int i = 0; i < 4; ++i) {
      if (buf[i] != 10 + i) return internal_error("element {} is {}", i, buf[i]);
    }
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
  EXPECT_EQ(fake.bytes_to_host(), 4 * sizeof(int32_t));
  EXPECT_EQ(fake.bytes_to_device(), 4 * sizeof(int32_t));
}

// allgather(recv, recv): this rank's block of recv is the input (the in-place form), on host and
// on device buffers alike.
TEST(DeviceStagingTest, AllgatherWithSendEqualToRecvIsInPlace) {
  FakeDeviceMemory fake;
  constexpr int kRanks = 3;
  constexpr size_t kCount = 5;
  auto worlds = loopback_worlds(kRanks);
  auto statuses = run_ranks(kRanks, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", worlds[rank]));
    std::vector<int32_t> host(kRanks * kCount, -1);
    auto* device = static_cast<int32_t*>(fake.allocate(host.size() * sizeof(int32_t)));
    for (size_t i = 0; i < kCount; ++i) host[rank * kCount + i] = device[rank * kCount + i] = rank * 10 + 1;
    for (int32_t* buf : {host.data(), device}) {
      COHORT_RETURN_IF_ERROR(comm->allgather(buf, buf, kCount, DataType::kInt32)->wait());
      for (int r = 0; r < kRanks; ++r) {
        if (buf[r * kCount + kCount - 1] != r * 10 + 1) {
          return internal_error("{} block {} holds {}", buf == device ? "device" : "host", r, buf[r * kCount]);
        }
      }
    }
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

}  // namespace
}  // namespace cohort::comm
