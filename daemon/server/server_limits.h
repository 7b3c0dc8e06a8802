#pragma once

// Bounds of every cohortd gRPC server, so that no client — buggy or hostile — can take the daemon's
// threads, memory or time without limit:
//   - a ResourceQuota caps the threads the synchronous server runs handlers on (each in-flight
//     call holds one; a call over the cap is refused with RESOURCE_EXHAUSTED);
//   - message sizes are capped both ways;
//   - HTTP/2 streams per connection are capped;
//   - every wait a client asks for (a rendezvous or store timeout_ms) is clamped to
//     kMaxClientTimeout by clamp_client_timeout.
// Each bound is a named constant here; changing one is a one-line change and a rebuild.
//
//   grpc::ServerBuilder builder;
//   apply_server_limits(builder);
//   Duration wait = clamp_client_timeout(Duration(request->timeout_ms()));
//
// Pure functions; thread-safe.

#include <chrono>
#include <cstddef>

#include <grpcpp/server_builder.h>

namespace cohort::daemon {

// Handler threads of one server. Rendezvous and store waits hold a thread each while they wait,
// one per rank of a starting job: this admits jobs of a couple of thousand ranks at once while
// bounding what a flood of calls can take.
inline constexpr int kMaxServerThreads = 2048;
// The largest message a server accepts: a store value (kMaxStoreValueBytes, 16 MiB) with room to
// spare; job specs and node reports are far smaller.
inline constexpr int kMaxReceiveMessageBytes = 32 * 1024 * 1024;
// The largest message a server sends: a page of jobs (ListJobs pages) or a log chunk fits easily.
inline constexpr int kMaxSendMessageBytes = 64 * 1024 * 1024;
// Concurrent HTTP/2 streams (calls) on one client connection (GRPC_ARG_MAX_CONCURRENT_STREAMS).
inline constexpr int kMaxConcurrentStreams = 256;
// The longest wait a client may ask one call for: the rendezvous and store defaults (5 min) with
// room for a slow start. A longer wait asked for is shortened to this; the client simply calls
// again, as it would after a timeout.
inline constexpr std::chrono::milliseconds kMaxClientTimeout = std::chrono::minutes(30);

// Sets the ResourceQuota (threads), the message-size caps and the stream cap on `builder`. Call
// before BuildAndStart.
void apply_server_limits(grpc::ServerBuilder& builder);

// `requested` clamped to [0, kMaxClientTimeout] (negative becomes 0).
std::chrono::milliseconds clamp_client_timeout(std::chrono::milliseconds requested);

}  // namespace cohort::daemon
