#pragma once

// Element types and reduction operators of the communication core. No libtorch here: buffers
// are raw pointers with an element count and a DataType.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "worker/base/status.h"

namespace cohort::comm {

enum class DataType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
};
inline constexpr int kNumDataTypes = 8;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kProduct = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,  // SUM, then divided by the number of contributing ranks.
};
inline constexpr int kNumReduceOps = 5;

// Bytes per element: 2 for f16/bf16, 4 for f32/i32, ...
size_t element_size(DataType dtype);
bool is_floating(DataType dtype);

// "f16", "bf16", "f32", "f64", "i8", "u8", "i32", "i64".
std::string_view data_type_name(DataType dtype);
// "sum", "prod", "min", "max", "avg".
std::string_view reduce_op_name(ReduceOp op);

// Parses the names above (also "float32", "half", "int64", "product", "mean" ...).
StatusOr<DataType> parse_data_type(std::string_view name);
StatusOr<ReduceOp> parse_reduce_op(std::string_view name);

// OK when `op` can reduce `dtype`; every op is defined for every dtype here (AVG on integers
// truncates toward zero, as torch.distributed does).
Status check_reduce_op(DataType dtype, ReduceOp op);

}  // namespace cohort::comm
