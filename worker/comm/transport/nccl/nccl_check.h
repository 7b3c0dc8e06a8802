#pragma once

// Checked NCCL calls: every call returning ncclResult_t goes through COHORT_NCCL_CHECK, which
// turns a failure into a Status carrying the call, NCCL's error text (and its last error
// message, which names the peer or the network failure), file and line:
//
//   COHORT_NCCL_RETURN_IF_ERROR(ncclAllReduce(buf, buf, count, type, ncclSum, comm, stream));
//   → "UNAVAILABLE: ncclAllReduce(...) failed: remote process exited or there was a network error
//      (ncclRemoteError; last NCCL error: ...) at worker/comm/transport/nccl/nccl_transport.cc:240"
//
// ncclInProgress is not a failure: non-blocking communicators return it while an operation is
// still being set up (nccl_transport.cc polls ncclCommGetAsyncError until it resolves).
// Only in the CUDA build (--config=cuda).

#include <string_view>

#include <nccl.h>

#include "worker/base/status.h"

namespace cohort::comm {

// Peer and network failures are UNAVAILABLE (as UCX's are), bad arguments and usage errors
// INVALID_ARGUMENT, CUDA and internal failures INTERNAL.
inline StatusCode nccl_status_code(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
    case ncclInProgress:
      return StatusCode::kOk;
    case ncclRemoteError:
    case ncclSystemError:
      return StatusCode::kUnavailable;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kInternal;
  }
}

inline Status nccl_call_status(ncclResult_t result, std::string_view call, const char* file, int line,
                               ncclComm_t comm = nullptr) {
  StatusCode code = nccl_status_code(result);
  if (code == StatusCode::kOk) return ok_status();
  const char* last = ncclGetLastError(comm);
  return Status(code, fmt::format("{} failed: {} (nccl result {}{}{}) at {}:{}", call, ncclGetErrorString(result),
                                  static_cast<int>(result), last != nullptr && *last != '\0' ? "; last NCCL error: " : "",
                                  last != nullptr ? last : "", file, line));
}

}  // namespace cohort::comm

// The Status of an NCCL call returning ncclResult_t.
#define COHORT_NCCL_CHECK(call) ::cohort::comm::nccl_call_status((call), #call, __FILE__, __LINE__)

// Returns the Status from the enclosing function when the NCCL call fails.
#define COHORT_NCCL_RETURN_IF_ERROR(call) COHORT_RETURN_IF_ERROR(COHORT_NCCL_CHECK(call))
