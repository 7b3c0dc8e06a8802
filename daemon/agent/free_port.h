#pragma once

// pick_free_port: a TCP port that is free right now on this machine, for MASTER_PORT. The kernel
// chooses it (bind to port 0), and the socket is closed before returning, so another process could
// take it in between; ephemeral ports are handed out round-robin, which makes that rare, and a
// worker that loses the race fails its bind with an error naming the port.

#include <string>

#include "worker/base/status.h"

namespace cohort::agent {

// Binds a TCP socket to `host`:0 (an IPv4 literal; "" or "0.0.0.0" for every interface) and returns
// the port the kernel chose. UNAVAILABLE naming the call and errno if the socket cannot be bound.
// Non-blocking; thread-safe.
StatusOr<int> pick_free_port(const std::string& host = "");

}  // namespace cohort::agent
