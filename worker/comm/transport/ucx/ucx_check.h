#pragma once

// Checked UCX calls: every UCX call that returns a ucs_status_t goes through COHORT_UCX_CHECK,
// which turns a failure into a Status carrying the call, the UCX error text, file and line:
//
//   COHORT_UCX_RETURN_IF_ERROR(ucp_worker_create(context, &params, &worker));
//   → "UNAVAILABLE: ucp_worker_create(context, &params, &worker) failed: No such device
//      (ucs status -4) at worker/comm/transport/ucx/ucx_transport.cc:212"

#include <string_view>

#include <ucs/type/status.h>

#include "worker/base/status.h"

namespace cohort::comm {

// The StatusCode a UCX error maps to: peer and network failures are UNAVAILABLE (retryable by a
// restart of the job), cancellation CANCELLED, bad arguments and truncation INVALID_ARGUMENT,
// timeouts DEADLINE_EXCEEDED, everything else INTERNAL.
inline StatusCode ucx_status_code(ucs_status_t status) {
  switch (status) {
    case UCS_OK:
      return StatusCode::kOk;
    case UCS_ERR_CANCELED:
      return StatusCode::kCancelled;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_MESSAGE_TRUNCATED:
    case UCS_ERR_INVALID_ADDR:
      return StatusCode::kInvalidArgument;
    case UCS_ERR_TIMED_OUT:
      return StatusCode::kDeadlineExceeded;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
    case UCS_ERR_OUT_OF_RANGE:
      return StatusCode::kResourceExhausted;
    case UCS_ERR_UNSUPPORTED:
      return StatusCode::kUnimplemented;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_BUSY:
    case UCS_ERR_SHMEM_SEGMENT:
      return StatusCode::kUnavailable;
    case UCS_ERR_ALREADY_EXISTS:
      return StatusCode::kAlreadyExists;
    default:
      return StatusCode::kInternal;
  }
}

// The Status of `call` (its source text) having returned `status` at file:line. OK for UCS_OK
// (and for UCS_INPROGRESS, which is not a failure).
inline Status ucx_call_status(ucs_status_t status, std::string_view call, const char* file, int line) {
  if (status == UCS_OK || status == UCS_INPROGRESS) return ok_status();
  return Status(ucx_status_code(status),
                fmt::format("{} failed: {} (ucs status {}) at {}:{}", call, ucs_status_string(status),
                            static_cast<int>(status), file, line));
}

}  // namespace cohort::comm

// The Status of a UCX call returning ucs_status_t.
#define COHORT_UCX_CHECK(call) ::cohort::comm::ucx_call_status((call), #call, __FILE__, __LINE__)

// Returns the Status from the enclosing function when the UCX call fails.
#define COHORT_UCX_RETURN_IF_ERROR(call) COHORT_RETURN_IF_ERROR(COHORT_UCX_CHECK(call))
