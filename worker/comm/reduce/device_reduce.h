#pragma once

// Reduction kernels for device (CUDA) memory: the twins of reduce_kernels.h, with the same
// semantics bit for bit where the arithmetic allows (integers wrap, NaN propagates through
// MIN/MAX, f16/bf16 computed in float and rounded once, AVG = SUM then scale_for_average).
// The kernels are in device_reduce_kernels.cu (nvcc); this is their typed interface.
//
// Every call enqueues one kernel on `stream` (a cudaStream_t; null for the default stream) and
// returns without waiting; the buffers must be device memory of the current device. Errors are
// launch errors (a bad pointer shows up at the next synchronisation). In a CPU-only build every
// call returns FAILED_PRECONDITION naming the build it needs. Thread-safe.

#include <cstddef>

#include "worker/base/status.h"
#include "worker/comm/types.h"

namespace cohort::comm {

// dst[i] = a[i] op b[i]; `dst` may be exactly `a` or `b`.
Status device_reduce_to(void* dst, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
                        void* stream);
// dst[i] = dst[i] op src[i].
Status device_reduce_into(void* dst, const void* src, size_t count, DataType dtype, ReduceOp op, void* stream);
// buf[i] /= divisor (see scale_for_average in reduce_kernels.h).
Status device_scale_for_average(void* buf, size_t count, DataType dtype, int divisor, void* stream);

}  // namespace cohort::comm
