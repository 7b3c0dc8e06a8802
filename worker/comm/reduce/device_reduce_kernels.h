#pragma once

// Launchers of the CUDA reduction kernels (device_reduce_kernels.cu). Plain C++ with integer
// codes for the dtype and op, so nvcc never parses the project's other headers (fmt, Status);
// device_reduce.h is the typed, Status-returning interface everything else uses.
//
// Each launcher enqueues one kernel on `stream` (a cudaStream_t) and returns the cudaError_t of
// the launch as an int (0 = cudaSuccess). Asynchronous: the result is ready when the stream is.

#include <cstddef>

namespace cohort::comm::cuda_kernels {

// dst[i] = a[i] op b[i]; `dtype` is a DataType value, `op` a ReduceOp value (kAvg reduces as kSum,
// like the host kernels). `dst` may be exactly `a` or `b`.
int launch_reduce_to(void* dst, const void* a, const void* b, size_t count, int dtype, int op, void* stream);

// buf[i] /= divisor with the host kernels' rounding (see reduce_kernels.h: scale_for_average).
int launch_scale_for_average(void* buf, size_t count, int dtype, int divisor, void* stream);

}  // namespace cohort::comm::cuda_kernels
