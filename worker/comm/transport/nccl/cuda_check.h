#pragma once

// Checked CUDA runtime calls: every call returning cudaError_t goes through COHORT_CUDA_CHECK,
// which turns a failure into a Status carrying the call, CUDA's error name and text, file and line:
//
//   COHORT_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
//   → "FAILED_PRECONDITION: cudaSetDevice(device) failed: cudaErrorInvalidDevice (invalid device
//      ordinal) at worker/comm/transport/nccl/nccl_transport.cc:120"
//
// Only in the CUDA build (--config=cuda): include it from code compiled under COHORT_CUDA.

#include <string_view>

#include <cuda_runtime_api.h>

#include "worker/base/status.h"

namespace cohort::comm {

// The StatusCode of a CUDA error: no or wrong device FAILED_PRECONDITION (the machine or the
// placement is wrong, not the call), out of memory RESOURCE_EXHAUSTED, bad arguments
// INVALID_ARGUMENT, a not-ready query is not an error, everything else (a kernel fault, a lost
// device) INTERNAL.
inline StatusCode cuda_status_code(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
    case cudaErrorNotReady:
      return StatusCode::kOk;
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
      return StatusCode::kFailedPrecondition;
    case cudaErrorMemoryAllocation:
      return StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kInternal;
  }
}

// The Status of `call` (its source text) having returned `error` at file:line.
inline Status cuda_call_status(cudaError_t error, std::string_view call, const char* file, int line) {
  StatusCode code = cuda_status_code(error);
  if (code == StatusCode::kOk) return ok_status();
  return Status(code, fmt::format("{} failed: {} ({}) at {}:{}", call, cudaGetErrorName(error),
                                  cudaGetErrorString(error), file, line));
}

}  // namespace cohort::comm

// The Status of a CUDA runtime call returning cudaError_t.
#define COHORT_CUDA_CHECK(call) ::cohort::comm::cuda_call_status((call), #call, __FILE__, __LINE__)

// Returns the Status from the enclosing function when the CUDA call fails.
#define COHORT_CUDA_RETURN_IF_ERROR(call) COHORT_RETURN_IF_ERROR(COHORT_CUDA_CHECK(call))
