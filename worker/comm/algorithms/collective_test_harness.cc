#include "worker/comm/algorithms/collective_test_harness.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "worker/comm/testing/rank_threads.h"
#include "worker/comm/testing/typed_values.h"
#include "worker/comm/transport/loopback/loopback_transport.h"

namespace cohort::comm::testing {
namespace {

// Forwards to another transport and counts what is posted through it.
class CountingTransport final : public Transport {
 public:
  CountingTransport(std::unique_ptr<Transport> inner, std::atomic<size_t>* posted)
      : inner_(std::move(inner)), posted_(posted) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view name() const override { return inner_->name(); }
  std::shared_ptr<TransportWork> isend(int peer, uint64_t tag, const void* data, size_t bytes) override {
    posted_->fetch_add(1);
    return inner_->isend(peer, tag, data, bytes);
  }
  std::shared_ptr<TransportWork> irecv(int peer, uint64_t tag, void* data, size_t bytes) override {
    posted_->fetch_add(1);
    return inner_->irecv(peer, tag, data, bytes);
  }
  Status peer_status(int peer) override { return inner_->peer_status(peer); }

 private:
  std::unique_ptr<Transport> inner_;
  std::atomic<size_t>* posted_;
};

// The value rank `rank` contributes at element `i`, as an integer valid for every dtype.
int64_t input_value(DataType dtype, ReduceOp op, int rank, size_t i) {
  const bool is_unsigned = dtype == DataType::kUInt8;
  const uint64_t mix = static_cast<uint64_t>(rank) * 7 + i * 13 + 3;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      // |sum| ≤ 8 · 4 = 32: exact everywhere, no overflow even in i8/u8.
      return is_unsigned ? static_cast<int64_t>(mix % 5) : static_cast<int64_t>(mix % 9) - 4;
    case ReduceOp::kProduct: {
      // ±1, ±2: products are ±2^k with k ≤ 8, exact in f16/bf16; integers may wrap (i8 at
      // 128, u8 at 256), which the reference reproduces.
      static constexpr int64_t kSigned[] = {1, 2, -1, -2, 1, -1, 2};
      return is_unsigned ? 1 + static_cast<int64_t>(mix % 3 == 0) : kSigned[(mix + i / 7) % 7];
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      const uint64_t spread = static_cast<uint64_t>(rank) * 31 + i * 17 + (i >> 5);
      return is_unsigned ? static_cast<int64_t>(spread % 251) : static_cast<int64_t>(spread % 201) - 100;
    }
  }
  return 0;
}

// `value` wrapped to the range of integer `dtype` (two's complement), as the kernels wrap.
int64_t wrap(DataType dtype, int64_t value) {
  switch (dtype) {
    case DataType::kInt8:
      return static_cast<int8_t>(static_cast<uint8_t>(value));
    case DataType::kUInt8:
      return static_cast<uint8_t>(value);
    case DataType::kInt32:
      return static_cast<int32_t>(static_cast<uint32_t>(value));
    default:
      return value;
  }
}

int64_t apply(ReduceOp op, int64_t a, int64_t b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
  }
  return 0;
}

}  // namespace

int rank_count_index(int ranks) {
  const auto* it = std::find(std::begin(kRankCounts), std::end(kRankCounts), ranks);
  return static_cast<int>(it - std::begin(kRankCounts));
}

std::string RunResult::failures() const { return comm::testing::failures(statuses); }

RunResult run_collective(int size, const std::function<Status(CollectiveContext&)>& body,
                         const RunOptions& options) {
  auto fabric = std::make_shared<LoopbackFabric>(size);
  std::atomic<size_t> posted{0};
  std::vector<std::unique_ptr<Transport>> transports;
  for (int rank = 0; rank < size; ++rank) {
    transports.push_back(std::make_unique<CountingTransport>(fabric->transport(rank), &posted));
  }
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  RunResult result;
  result.elapsed.resize(size);
  const Clock::time_point start = Clock::now();
  result.statuses = run_ranks(
      size,
      [&](int rank) {
        if (std::find(options.absent.begin(), options.absent.end(), rank) != options.absent.end()) {
          return ok_status();
        }
        std::vector<uint8_t> scratch;
        Status status;
        {
          CollectiveContext ctx(transports[rank].get(), &ranks, rank, collective_tag_base(0, 1),
                                Deadline::after(options.deadline), options.op, &scratch);
          status = body(ctx);
        }
        result.elapsed[rank] = std::chrono::duration_cast<Duration>(Clock::now() - start);
        return status;
      },
      options.deadline + std::chrono::seconds(30));
  result.transfers_posted = posted.load();
  return result;
}

std::vector<uint8_t> reduction_input(DataType dtype, ReduceOp op, int rank, size_t count) {
  std::vector<uint8_t> buf(count * element_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    write_value(buf.data(), dtype, i, static_cast<double>(input_value(dtype, op, rank, i)));
  }
  return buf;
}

std::vector<uint8_t> reduction_reference(DataType dtype, ReduceOp op, int size, size_t first, size_t count) {
  std::vector<uint8_t> buf(count * element_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    int64_t acc = input_value(dtype, op, 0, first + i);
    for (int rank = 1; rank < size; ++rank)
      acc = wrap(dtype, apply(op, acc, input_value(dtype, op, rank, first + i)));
    write_value(buf.data(), dtype, i, static_cast<double>(acc));
  }
  return buf;
}

std::vector<uint8_t> pattern_bytes(int rank, size_t bytes, uint32_t salt) {
  std::vector<uint8_t> buf(bytes);
  uint32_t state = 0x9e3779b9u * static_cast<uint32_t>(rank + 1) + salt * 0x85ebca6bu;
  for (size_t i = 0; i < bytes; ++i) {
    state = state * 1664525u + 1013904223u;
    buf[i] = static_cast<uint8_t>(state >> 24);
  }
  return buf;
}

std::string compare_elements(const void* actual, const void* expected, size_t count, DataType dtype) {
  const size_t width = element_size(dtype);
  for (size_t i = 0; i < count; ++i) {
    if (std::memcmp(static_cast<const uint8_t*>(actual) + i * width,
                    static_cast<const uint8_t*>(expected) + i * width, width) != 0) {
      return fmt::format("{} element {} of {} is {}, expected {}", data_type_name(dtype), i, count,
                         read_value(actual, dtype, i), read_value(expected, dtype, i));
    }
  }
  return "";
}

std::string compare_bytes(const void* actual, const void* expected, size_t bytes) {
  const auto* a = static_cast<const uint8_t*>(actual);
  const auto* e = static_cast<const uint8_t*>(expected);
  for (size_t i = 0; i < bytes; ++i) {
    if (a[i] != e[i]) return fmt::format("byte {} of {} is {}, expected {}", i, bytes, a[i], e[i]);
  }
  return "";
}

std::string case_name(Algorithm algorithm, int ranks) {
  return fmt::format("{}_{}ranks", algorithm_name(algorithm), ranks);
}

}  // namespace cohort::comm::testing
