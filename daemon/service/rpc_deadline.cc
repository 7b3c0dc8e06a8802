#include "daemon/service/rpc_deadline.h"

#include <algorithm>

#include "daemon/server/server_limits.h"

namespace cohort::daemon {

Duration time_to_client_deadline(const grpc::ServerContext& context) {
  const auto deadline = context.deadline();
  // A call without a deadline reports gRPC's "infinite future"; anything decades away counts.
  constexpr auto kNoDeadline = std::chrono::hours(24 * 365 * 10);
  const auto now = std::chrono::system_clock::now();
  if (deadline >= now + kNoDeadline) return Duration::max();
  if (deadline <= now) return Duration(0);
  return std::chrono::duration_cast<Duration>(deadline - now);
}

StatusOr<Duration> bounded_wait(const grpc::ServerContext& context, int64_t timeout_ms, Duration fallback,
                                std::string_view field) {
  if (timeout_ms < 0) {
    return invalid_argument_error(
        "{} is {}; give a wait in milliseconds, or 0 for the server's default ({} ms)", field, timeout_ms,
        fallback.count());
  }
  // Clamped (kMaxClientTimeout): a client cannot hold a handler thread for longer than that.
  const Duration requested = clamp_client_timeout(timeout_ms == 0 ? fallback : Duration(timeout_ms));
  return std::min(requested, time_to_client_deadline(context));
}

}  // namespace cohort::daemon
