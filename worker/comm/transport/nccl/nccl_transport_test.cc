// NcclTransport: ranks as threads, one GPU each, bootstrapped through one HashStore. Collectives
// for every dtype (f16/bf16 natively), send/recv in a ring, host buffers refused, and a peer that
// never joins turning into DEADLINE_EXCEEDED plus an aborted communicator within the deadline,
// never a hang. Without a GPU (or in a CPU-only build) every case prints why and is SKIPPED.

#include <gtest/gtest.h>

#include "worker/comm/transport/nccl/cuda_testing.h"

#if COHORT_CUDA

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "worker/comm/reduce/reduce_kernels.h"
#include "worker/comm/store/hash_store.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/comm/testing/typed_values.h"
#include "worker/comm/transport/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>

namespace cohort::comm {
namespace {

using testing::DeviceBuffer;
using testing::failures;
using testing::read_value;
using testing::run_ranks;
using testing::write_value;

constexpr Duration kOpTimeout = std::chrono::seconds(60);
constexpr DataType kAllTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                                  DataType::kInt8,    DataType::kUInt8,    DataType::kInt32,   DataType::kInt64};

// Ranks for multi-rank cases: one per GPU, at most 4.
int gpu_ranks() { return std::min(cuda_device_count(), 4); }

// Runs `body(rank, transport)` on `size` threads, each with its own communicator on GPU `rank`.
std::vector<Status> with_transports(int size,
                                    const std::function<Status(int, NcclTransport&)>& body) {
  auto store = std::make_shared<HashStore>();
  return run_ranks(size, [&](int rank) -> Status {
    NcclOptions options;
    options.device = rank;
    options.init_timeout = std::chrono::seconds(60);
    COHORT_ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> transport,
                            NcclTransport::create(*store, rank, size, options));
    COHORT_RETURN_IF_ERROR(cudaSetDevice(rank) == cudaSuccess ? ok_status() : internal_error("cudaSetDevice"));
    return body(rank, *transport);
  });
}

// Bytes of `count` elements of `dtype`, element i = value(i).
std::vector<uint8_t> make_values(DataType dtype, size_t count, const std::function<double(size_t)>& value) {
  std::vector<uint8_t> bytes(count * element_size(dtype));
  for (size_t i = 0; i < count; ++i) write_value(bytes.data(), dtype, i, value(i));
  return bytes;
}

Status expect_values(const std::vector<uint8_t>& bytes, DataType dtype, const std::function<double(size_t)>& value,
                     const char* what, int rank) {
  size_t count = bytes.size() / element_size(dtype);
  for (size_t i = 0; i < count; ++i) {
    double got = read_value(bytes.data(), dtype, i);
    if (got != value(i)) {
      return internal_error("{} {} on rank {}: element {} is {}, expected {}", what, data_type_name(dtype), rank, i,
                            got, value(i));
    }
  }
  return ok_status();
}

TEST(NcclTransportTest, AllreduceEveryDtypeAndOp) {
  COHORT_SKIP_UNLESS_GPUS(1);
  const int size = gpu_ranks();
  const size_t count = 1000;
  auto statuses = with_transports(size, [&](int rank, NcclTransport& nccl) -> Status {
    for (DataType dtype : kAllTypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg}) {
        // Small integers: exact in every dtype, and i8 sums of ≤ 4 ranks stay in range.
        auto input = [&](size_t i) { return static_cast<double>((i + rank) % 7); };
        auto expected = [&](size_t i) {
          double sum = 0, lo = 1e9, hi = -1e9;
          for (int r = 0; r < size; ++r) {
            double v = static_cast<double>((i + r) % 7);
            sum += v;
            lo = std::min(lo, v);
            hi = std::max(hi, v);
          }
          if (op == ReduceOp::kSum) return sum;
          if (op == ReduceOp::kMin) return lo;
          if (op == ReduceOp::kMax) return hi;
          // AVG: what the host kernels produce from the exact sum (integers truncate, f16/bf16
          // round once), which the device path must match.
          std::vector<uint8_t> one = make_values(dtype, 1, [&](size_t) { return sum; });
          scale_for_average(one.data(), 1, dtype, size);
          return read_value(one.data(), dtype, 0);
        };
        DeviceBuffer<uint8_t> buf(make_values(dtype, count, input));
        COHORT_RETURN_IF_ERROR(
            nccl.allreduce(nullptr, buf.data(), count, dtype, op, Deadline::after(kOpTimeout)));
        COHORT_RETURN_IF_ERROR(expect_values(buf.download(), dtype, expected, reduce_op_name(op).data(), rank));
      }
    }
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(NcclTransportTest, BroadcastAllgatherReduceScatter) {
  COHORT_SKIP_UNLESS_GPUS(1);
  const int size = gpu_ranks();
  const size_t count = 257;  // odd: no chunk alignment luck
  auto statuses = with_transports(size, [&](int rank, NcclTransport& nccl) -> Status {
    const DataType dtype = DataType::kBFloat16;
    // broadcast from the last rank
    int root = size - 1;
    DeviceBuffer<uint8_t> bcast(make_values(dtype, count, [&](size_t i) { return rank == root ? i % 50 : 99.0; }));
    COHORT_RETURN_IF_ERROR(nccl.broadcast(bcast.data(), count, dtype, root, Deadline::after(kOpTimeout)));
    COHORT_RETURN_IF_ERROR(
        expect_values(bcast.download(), dtype, [](size_t i) { return static_cast<double>(i % 50); }, "broadcast", rank));
    // allgather: block r holds r + 1 everywhere
    DeviceBuffer<uint8_t> mine(make_values(dtype, count, [&](size_t) { return rank + 1.0; }));
    DeviceBuffer<uint8_t> all(count * size * element_size(dtype));
    COHORT_RETURN_IF_ERROR(nccl.allgather(mine.data(), all.data(), count, dtype, Deadline::after(kOpTimeout)));
    COHORT_RETURN_IF_ERROR(expect_values(
        all.download(), dtype, [&](size_t i) { return static_cast<double>(i / count + 1); }, "allgather", rank));
    // reduce_scatter of all-ones: every element is `size`
    DeviceBuffer<uint8_t> ones(make_values(dtype, count * size, [](size_t) { return 1.0; }));
    DeviceBuffer<uint8_t> shard(count * element_size(dtype));
    COHORT_RETURN_IF_ERROR(
        nccl.reduce_scatter(ones.data(), shard.data(), count, dtype, ReduceOp::kSum, Deadline::after(kOpTimeout)));
    return expect_values(
        shard.download(), dtype, [&](size_t) { return static_cast<double>(size); }, "reduce_scatter", rank);
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(NcclTransportTest, SendRecvAroundARing) {
  COHORT_SKIP_UNLESS_GPUS(2);
  const int size = gpu_ranks();
  const size_t bytes = 1 << 20;
  auto statuses = with_transports(size, [&](int rank, NcclTransport& nccl) -> Status {
    std::vector<uint8_t> out(bytes, static_cast<uint8_t>(rank + 1));
    DeviceBuffer<uint8_t> send(out);
    DeviceBuffer<uint8_t> recv(bytes);
    // Both posted before either is waited on: launched as one NCCL group.
    auto sent = nccl.isend((rank + 1) % size, 7, send.data(), bytes);
    auto received = nccl.irecv((rank + size - 1) % size, 7, recv.data(), bytes);
    COHORT_RETURN_IF_ERROR(received->wait(kOpTimeout));
    COHORT_RETURN_IF_ERROR(sent->wait(kOpTimeout));
    std::vector<uint8_t> got = recv.download();
    uint8_t expected = static_cast<uint8_t>((rank + size - 1) % size + 1);
    if (std::any_of(got.begin(), got.end(), [&](uint8_t b) { return b != expected; })) {
      return internal_error("rank {} received bytes other than {}", rank, expected);
    }
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(NcclTransportTest, HostBuffersAreRefusedWithAClearError) {
  COHORT_SKIP_UNLESS_GPUS(1);
  auto statuses = with_transports(1, [&](int, NcclTransport& nccl) -> Status {
    std::vector<float> host(16, 1.0f);
    Status status =
        nccl.allreduce(nullptr, host.data(), host.size(), DataType::kFloat32, ReduceOp::kSum, Deadline::after(kOpTimeout));
    if (status.code() != StatusCode::kInvalidArgument || status.message().find("host memory") == std::string::npos) {
      return internal_error("expected INVALID_ARGUMENT naming host memory, got {}", status.to_string());
    }
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(NcclTransportTest, APeerThatNeverJoinsAbortsWithinTheDeadline) {
  COHORT_SKIP_UNLESS_GPUS(2);
  constexpr Duration kShort = std::chrono::seconds(3);
  auto statuses = with_transports(2, [&](int rank, NcclTransport& nccl) -> Status {
    if (rank == 1) return ok_status();  // created the communicator, then "died" (never calls)
    DeviceBuffer<float> buf(std::vector<float>(1024, 1.0f));
    auto start = Clock::now();
    Status status = nccl.allreduce(nullptr, buf.data(), 1024, DataType::kFloat32, ReduceOp::kSum,
                                   Deadline::after(kShort));
    auto waited = std::chrono::duration_cast<Duration>(Clock::now() - start);
    if (status.code() != StatusCode::kDeadlineExceeded && status.code() != StatusCode::kUnavailable) {
      return internal_error("expected DEADLINE_EXCEEDED or UNAVAILABLE, got {}", status.to_string());
    }
    if (waited > 2 * kShort) return internal_error("took {} for a {} deadline", format_duration(waited), format_duration(kShort));
    if (nccl.peer_status(1).ok()) return internal_error("communicator not aborted after the failure");
    Status after = nccl.broadcast(buf.data(), 1024, DataType::kFloat32, 0, Deadline::after(kShort));
    if (after.ok()) return internal_error("an aborted communicator ran a broadcast");
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

}  // namespace
}  // namespace cohort::comm

#else  // CPU-only build: the cases exist and say why they cannot run.

TEST(NcclTransportTest, NeedsACudaBuildAndAGpu) { COHORT_SKIP_UNLESS_GPUS(1); }

#endif
