#pragma once

// How long a server handler may block: the wait the request asks for, capped by the client's own
// deadline (STYLE rule 5: nothing blocks forever, and no handler outlives the call it serves).

#include <chrono>
#include <cstdint>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "worker/base/status.h"

namespace cohort::daemon {

using Duration = std::chrono::milliseconds;

// Time left before `context`'s deadline (0 once passed); Duration::max() when the client set
// none. Non-blocking.
Duration time_to_client_deadline(const grpc::ServerContext& context);

// The wait for a request's `timeout_ms` field (named `field` in errors): 0 takes `fallback`,
// the result is clamped to kMaxClientTimeout (daemon/server/server_limits.h), and it never exceeds
// the client's remaining deadline. INVALID_ARGUMENT for a negative
// value. Non-blocking.
StatusOr<Duration> bounded_wait(const grpc::ServerContext& context, int64_t timeout_ms, Duration fallback,
                                std::string_view field = "timeout_ms");

}  // namespace cohort::daemon
