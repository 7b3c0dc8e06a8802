#pragma once

// Test harness for the collective algorithms: runs a collective on ranks-as-threads over a fresh
// loopback fabric, counts the transfers it posts, and builds inputs and serial references.
//
// Reduction inputs are small integers chosen per op so that every reduction over up to 8 ranks
// is exact in every DataType (f16 and bf16 included): results are compared bit for bit, whatever
// order an algorithm combines ranks in. Integer SUM/PRODUCT results wrap like the kernels do.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/algorithm.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/deadline.h"
#include "worker/comm/transport/transport.h"
#include "worker/comm/types.h"

namespace cohort::comm::testing {

inline constexpr DataType kAllDataTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                                             DataType::kFloat64, DataType::kInt8,     DataType::kUInt8,
                                             DataType::kInt32,   DataType::kInt64};
inline constexpr ReduceOp kReduceOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax};
inline constexpr int kRankCounts[] = {1, 2, 3, 4, 5, 8};
inline constexpr size_t kSmallCounts[] = {0, 1, 7, 1000};
// Large enough for many pipeline segments per block, and odd so nothing divides evenly.
inline constexpr size_t kLargeCount = (size_t{1} << 20) + 3;
inline constexpr Duration kTestDeadline = std::chrono::seconds(60);

// Index of `ranks` in kRankCounts (tests rotate dtypes over rank counts for large sizes).
int rank_count_index(int ranks);

struct RunOptions {
  Duration deadline = kTestDeadline;  // the collective's deadline on every rank
  std::string op = "test";            // the context's op name (appears in errors)
  // Ranks that never call the collective (simulating a rank that never arrives).
  std::vector<int> absent;
};

// What one run did.
struct RunResult {
  std::vector<Status> statuses;   // per rank
  std::vector<Duration> elapsed;  // per rank: time from start until its collective returned
  size_t transfers_posted = 0;    // isend + irecv calls over all ranks
  std::string failures() const;   // "" when every rank succeeded
};

// Runs `body(ctx)` on `size` rank threads, each with its own CollectiveContext over one fresh
// loopback fabric (tag base of sequence 1, context 0).
RunResult run_collective(int size, const std::function<Status(CollectiveContext&)>& body,
                         const RunOptions& options = {});

// Rank `rank`'s input for reducing `count` elements of `dtype` with `op` (see the file comment).
std::vector<uint8_t> reduction_input(DataType dtype, ReduceOp op, int rank, size_t count);
// The serial reduction of reduction_input over ranks 0 .. size-1, elements [first, first+count)
// of the inputs (for reduce-scatter blocks).
std::vector<uint8_t> reduction_reference(DataType dtype, ReduceOp op, int size, size_t first, size_t count);

// Deterministic bytes that differ by rank, position and salt (for data-movement collectives).
std::vector<uint8_t> pattern_bytes(int rank, size_t bytes, uint32_t salt = 0);

// "" when equal; otherwise where and how they first differ (read as `dtype` elements).
std::string compare_elements(const void* actual, const void* expected, size_t count, DataType dtype);
std::string compare_bytes(const void* actual, const void* expected, size_t bytes);

// "ring_3ranks" style names for parameterised tests.
std::string case_name(Algorithm algorithm, int ranks);

}  // namespace cohort::comm::testing
