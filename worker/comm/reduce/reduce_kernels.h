#pragma once

// Element-wise reduction kernels: the one place where a DataType and a ReduceOp turn into
// arithmetic. Algorithms are dtype-agnostic byte movers; whenever they combine two blocks they
// call these.
//
// Semantics, identical for every algorithm so results never depend on the one chosen:
// - Integers wrap around (two's complement) on SUM and PRODUCT overflow, as torch does.
// - Floating MIN and MAX propagate NaN (torch.minimum / torch.maximum), which also makes them
//   independent of the order ranks are combined in.
// - f16 and bf16 are computed in float: each call widens a block, reduces it and rounds back once
//   to nearest even (see half_precision.h).
// - ReduceOp::kAvg reduces as kSum. Averaging is a single scale_for_average over the final result
//   (the communicator does it; algorithms never see kAvg), so the kernels need no divisor.
//
// Speed: the loops are vectorised and built twice, for AVX2 and for the x86-64 baseline, the
// CPU picking one at load time; f16 converts with F16C where the CPU has it. Results are
// bit-identical on every path.
//
// All functions are thread-safe (no state), never fail and do not allocate. Buffers hold `count`
// elements of `dtype`, aligned to the element size (as any array of that type is), and may be
// null when `count` is 0.

#include <cstddef>

#include "worker/comm/types.h"

namespace cohort::comm {

// dst[i] = dst[i] op src[i]. `dst` and `src` must not overlap.
void reduce_into(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op);

// dst[i] = a[i] op b[i], for fused out-of-place steps (e.g. the last reduce-scatter step writing
// straight into the output). `dst` may be exactly `a` or exactly `b`; otherwise no overlap.
void reduce_to(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

// buf[i] = buf[i] / divisor, for AVG after a SUM. Floating types multiply by 1/divisor computed
// in the type's arithmetic precision (float for f16/bf16/f32, double for f64); integer types
// divide, truncating toward zero (torch.distributed's AVG on integer tensors). `divisor` ≥ 1;
// 1 leaves the buffer untouched.
void scale_for_average(void* buf, size_t count, DataType dtype, int divisor);

}  // namespace cohort::comm
