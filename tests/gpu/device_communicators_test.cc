// Communicators on device buffers. Every kind also runs check_every_collective: all collectives
// and point to point on device buffers (and host and device mixed) against the host path.
// pure_nccl: allreduce (SUM, AVG on bf16) and broadcast through NCCL, ranks as threads with one
// GPU each. Every host kind (naive, flat, hierarchical,
// two_dimensional, single_node): device buffers staged through pinned host memory around the host
// path, four ranks as threads sharing GPU 0 over the loopback transport (two simulated nodes for
// the two-level kinds where they allow it). hierarchical, two_dimensional and single_node with a
// GPU per rank: NCCL inside the node, staging between nodes. Without GPUs every case is SKIPPED
// with the reason.

#include <gtest/gtest.h>

#include "worker/comm/transport/nccl/cuda_testing.h"

#if COHORT_CUDA

#include <algorithm>
#include <vector>

#include <cuda_runtime_api.h>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/communicators/pure_nccl_communicator.h"
#include "worker/comm/testing/device_collectives.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/comm/testing/typed_values.h"

namespace cohort::comm {
namespace {

using testing::DeviceBuffer;
using testing::failures;
using testing::loopback_worlds;
using testing::read_value;
using testing::run_ranks;
using testing::write_value;

// cudaMalloc'ed memory of the thread's current device, for check_every_collective.
class CudaSpace final : public testing::BufferSpace {
 public:
  ~CudaSpace() override {
    for (void* block : blocks_) cudaFree(block);
  }
  std::string name() const override { return "CUDA device"; }
  void* allocate(size_t bytes) override {
    void* block = nullptr;
    if (cudaMalloc(&block, bytes == 0 ? 1 : bytes) != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc of " << bytes << " bytes failed";
      return nullptr;
    }
    blocks_.push_back(block);
    return block;
  }
  Status upload(void* to, const void* host, size_t bytes) override {
    return cudaMemcpy(to, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess
               ? ok_status()
               : internal_error("cudaMemcpy to device");
  }
  Status download(void* host, const void* from, size_t bytes) override {
    return cudaMemcpy(host, from, bytes, cudaMemcpyDeviceToHost) == cudaSuccess
               ? ok_status()
               : internal_error("cudaMemcpy to host");
  }

 private:
  std::vector<void*> blocks_;
};

// Every collective and point-to-point form on device buffers against the host path, for each
// dtype; `mixed`: also host and device buffers in one call (the staging kinds accept that, the
// NCCL kinds refuse it).
Status check_all(Communicator& comm, bool mixed) {
  CudaSpace space;
  testing::CheckOptions options;
  options.mixed = mixed;
  for (DataType dtype : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat16, DataType::kInt64}) {
    COHORT_RETURN_IF_ERROR(testing::check_every_collective(comm, space, dtype, options));
  }
  return ok_status();
}

// An NCCL kind refuses a call that mixes host and device buffers, on every rank, naming the
// host buffer (each rank decides alone, so none may fall back to staging).
Status expect_mixed_refused(Communicator& comm) {
  CudaSpace space;
  std::vector<float> host(16, 1.0f);
  void* device = space.allocate(16 * sizeof(float));
  Status status = comm.allreduce(host.data(), device, 16, DataType::kFloat32, ReduceOp::kSum)->wait();
  if (status.code() != StatusCode::kInvalidArgument ||
      status.message().find("host memory") == std::string::npos) {
    return internal_error("{}: a mixed allreduce gave '{}', expected INVALID_ARGUMENT naming host memory",
                          comm.kind(), status.to_string());
  }
  return ok_status();
}

// allreduce SUM and AVG, then broadcast from the last rank, all on device buffers; checks values.
// The default count is odd (uneven shards); two_dimensional's NCCL path needs an even split.
Status exercise(Communicator& comm, DataType dtype, size_t count = 1031) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<uint8_t> host(count * element_size(dtype));
  for (size_t i = 0; i < count; ++i) write_value(host.data(), dtype, i, static_cast<double>(rank + 1));
  DeviceBuffer<uint8_t> buf(host);
  COHORT_RETURN_IF_ERROR(comm.allreduce(buf.data(), buf.data(), count, dtype, ReduceOp::kSum)->wait());
  std::vector<uint8_t> got = buf.download();
  const double sum = size * (size + 1) / 2.0;
  for (size_t i = 0; i < count; ++i) {
    if (read_value(got.data(), dtype, i) != sum) {
      return internal_error("{} allreduce sum on rank {}: element {} is {}, expected {}", comm.kind(), rank,
                            i, read_value(got.data(), dtype, i), sum);
    }
  }
  // AVG of the original values again (the buffer now holds the sum on every rank, whose average
  // is the sum itself: with one rank, as pure_nccl has on a one-GPU machine, both read alike).
  buf.upload(host);
  COHORT_RETURN_IF_ERROR(comm.allreduce(buf.data(), buf.data(), count, dtype, ReduceOp::kAvg)->wait());
  got = buf.download();
  if (read_value(got.data(), dtype, 0) != sum / size && dtype != DataType::kInt32) {
    return internal_error("{} allreduce avg on rank {}: {} != {}", comm.kind(), rank,
                          read_value(got.data(), dtype, 0), sum / size);
  }
  for (size_t i = 0; i < count; ++i) write_value(host.data(), dtype, i, rank == size - 1 ? 42.0 : -1.0);
  buf.upload(host);
  COHORT_RETURN_IF_ERROR(comm.broadcast(buf.data(), count, dtype, size - 1)->wait());
  got = buf.download();
  for (size_t i = 0; i < count; ++i) {
    if (read_value(got.data(), dtype, i) != 42.0) {
      return internal_error("{} broadcast on rank {}: element {} is {}", comm.kind(), rank, i,
                            read_value(got.data(), dtype, i));
    }
  }
  return ok_status();
}

TEST(DeviceCommunicatorsTest, PureNcclRunsCollectivesThroughNccl) {
  COHORT_SKIP_UNLESS_GPUS(1);
  const int size = std::min(cuda_device_count(), 4);
  auto worlds = loopback_worlds(size);
  auto statuses = run_ranks(size, [&](int rank) -> Status {
    // pure_nccl takes the thread's current device (no LOCAL_RANK in a test).
    if (cudaSetDevice(rank) != cudaSuccess) return internal_error("cudaSetDevice({})", rank);
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("pure_nccl", worlds[rank]));
    if (dynamic_cast<PureNcclCommunicator*>(comm.get()) == nullptr)
      return internal_error("not a PureNcclCommunicator");
    COHORT_RETURN_IF_ERROR(exercise(*comm, DataType::kBFloat16));
    COHORT_RETURN_IF_ERROR(exercise(*comm, DataType::kFloat32));
    COHORT_RETURN_IF_ERROR(check_all(*comm, /*mixed=*/false));
    return expect_mixed_refused(*comm);
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(DeviceCommunicatorsTest, HostKindsStageDeviceBuffers) {
  COHORT_SKIP_UNLESS_GPUS(1);
  constexpr int kRanks = 4;
  for (const std::string& kind : communicator_kinds()) {
    if (kind == "pure_nccl") continue;
    SCOPED_TRACE(kind);
    // Two simulated nodes of two ranks, except single_node, which refuses to span nodes.
    auto worlds =
        loopback_worlds(kRanks, kind == "single_node" ? testing::nodes_of(kRanks) : testing::nodes_of(2));
    auto statuses = run_ranks(kRanks, [&](int rank) -> Status {
      if (cudaSetDevice(0) != cudaSuccess) return internal_error("cudaSetDevice(0)");
      COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator(kind, worlds[rank]));
      COHORT_RETURN_IF_ERROR(exercise(*comm, DataType::kFloat16));
      COHORT_RETURN_IF_ERROR(exercise(*comm, DataType::kInt32));
      return check_all(*comm, /*mixed=*/true);
    });
    EXPECT_EQ(failures(statuses), "");
  }
}

TEST(DeviceCommunicatorsTest, NodeKindsUseNcclInsideTheNodeWhenEveryRankHasAGpu) {
  COHORT_SKIP_UNLESS_GPUS(2);
  const int size = cuda_device_count() >= 4 ? 4 : 2;
  for (const std::string kind : {"hierarchical", "two_dimensional", "single_node"}) {
    SCOPED_TRACE(kind);
    // hierarchical: nodes of two ranks (2 ranks: one node; 4: two nodes, leaders staged between
    // them); single_node: one node.
    auto worlds = loopback_worlds(size, testing::nodes_of(kind == "single_node" ? size : 2));
    auto statuses = run_ranks(size, [&](int rank) -> Status {
      if (cudaSetDevice(rank) != cudaSuccess) return internal_error("cudaSetDevice({})", rank);
      COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator(kind, worlds[rank]));
      COHORT_RETURN_IF_ERROR(exercise(*comm, DataType::kBFloat16, 1032));
      COHORT_RETURN_IF_ERROR(exercise(*comm, DataType::kFloat32, 1032));
      COHORT_RETURN_IF_ERROR(exercise(*comm, DataType::kFloat32));  // odd: two_dimensional stages this one
      // single_node runs every collective on NCCL here; the two-level kinds only allreduce (the
      // rest is staged), but their allreduce refuses mixed buffers too.
      return check_all(*comm, /*mixed=*/false);
    });
    EXPECT_EQ(failures(statuses), "");
  }
}

}  // namespace
}  // namespace cohort::comm

#else  // CPU-only build

TEST(DeviceCommunicatorsTest, NeedsACudaBuildAndAGpu) { COHORT_SKIP_UNLESS_GPUS(1); }

#endif
