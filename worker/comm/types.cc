#include "worker/comm/types.h"

#include <string>

namespace cohort::comm {

size_t element_size(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
    case DataType::kBFloat16: return 2;
    case DataType::kFloat32:
    case DataType::kInt32: return 4;
    case DataType::kFloat64:
    case DataType::kInt64: return 8;
    case DataType::kInt8:
    case DataType::kUInt8: return 1;
  }
  return 0;
}

bool is_floating(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 || dtype == DataType::kFloat32 ||
         dtype == DataType::kFloat64;
}

std::string_view data_type_name(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16: return "f16";
    case DataType::kBFloat16: return "bf16";
    case DataType::kFloat32: return "f32";
    case DataType::kFloat64: return "f64";
    case DataType::kInt8: return "i8";
    case DataType::kUInt8: return "u8";
    case DataType::kInt32: return "i32";
    case DataType::kInt64: return "i64";
  }
  return "?";
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProduct: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
  return "?";
}

StatusOr<DataType> parse_data_type(std::string_view name) {
  struct Alias { std::string_view name; DataType dtype; };
  static constexpr Alias kAliases[] = {
      {"f16", DataType::kFloat16},   {"half", DataType::kFloat16},     {"float16", DataType::kFloat16},
      {"bf16", DataType::kBFloat16}, {"bfloat16", DataType::kBFloat16}, {"f32", DataType::kFloat32},
      {"float", DataType::kFloat32}, {"float32", DataType::kFloat32},   {"f64", DataType::kFloat64},
      {"double", DataType::kFloat64}, {"float64", DataType::kFloat64},  {"i8", DataType::kInt8},
      {"int8", DataType::kInt8},     {"u8", DataType::kUInt8},          {"uint8", DataType::kUInt8},
      {"i32", DataType::kInt32},     {"int", DataType::kInt32},         {"int32", DataType::kInt32},
      {"i64", DataType::kInt64},     {"int64", DataType::kInt64},       {"long", DataType::kInt64},
  };
  for (const Alias& alias : kAliases) {
    if (alias.name == name) return alias.dtype;
  }
  return invalid_argument_error("unknown data type '{}' (expected one of f16 bf16 f32 f64 i8 u8 i32 i64)", name);
}

StatusOr<ReduceOp> parse_reduce_op(std::string_view name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "prod" || name == "product") return ReduceOp::kProduct;
  if (name == "min") return ReduceOp::kMin;
  if (name == "max") return ReduceOp::kMax;
  if (name == "avg" || name == "mean") return ReduceOp::kAvg;
  return invalid_argument_error("unknown reduce op '{}' (expected one of sum prod min max avg)", name);
}

Status check_reduce_op(DataType dtype, ReduceOp op) {
  if (static_cast<int>(dtype) >= kNumDataTypes) {
    return invalid_argument_error("invalid data type value {}", static_cast<int>(dtype));
  }
  if (static_cast<int>(op) >= kNumReduceOps) {
    return invalid_argument_error("invalid reduce op value {}", static_cast<int>(op));
  }
  return ok_status();
}

}  // namespace cohort::comm
