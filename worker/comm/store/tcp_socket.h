#pragma once

// The few TCP socket steps the tcp store needs, each bounded by a deadline: connect, listen,
// send all bytes, receive exactly n bytes. Sockets are non-blocking; waits use poll(2). Sends
// never raise SIGPIPE (a dead peer is an error, not a signal that kills the process).

#include <cstddef>
#include <string>
#include <string_view>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/store/scoped_fd.h"

namespace cohort::comm {

// "127.0.0.1:4567", "[::1]:4567".
std::string format_host_port(std::string_view host, int port);

// One attempt to connect to host:port (each resolved address in turn) before `deadline`. The
// socket is non-blocking with TCP_NODELAY. UNAVAILABLE when refused or unreachable,
// DEADLINE_EXCEEDED when the deadline passed, INVALID_ARGUMENT when the host does not resolve.
StatusOr<ScopedFd> connect_tcp(const std::string& host, int port, Deadline deadline);

// A non-blocking listening socket on host:port. `host` "" binds every interface (IPv6 dual-stack
// where the kernel has IPv6, IPv4 otherwise); port 0 lets the kernel pick (see bound_port).
StatusOr<ScopedFd> listen_tcp(const std::string& host, int port);

// The address of `fd`'s peer, "10.0.0.7:51234" ("?" when unknown), for logs.
std::string peer_address(int fd);

// The local port `fd` is bound to.
StatusOr<int> bound_port(int fd);

Status set_nonblocking(int fd);
// Disables Nagle: the store's small requests and replies go out at once.
void set_no_delay(int fd);

// Sends all of `data`. DEADLINE_EXCEEDED if the peer does not drain it before `deadline`.
Status send_all(int fd, std::string_view data, Deadline deadline);

// Receives exactly `size` bytes into `*out`. UNAVAILABLE when the peer closes the connection
// first, DEADLINE_EXCEEDED when `deadline` passes first.
Status recv_exact(int fd, size_t size, Deadline deadline, std::string* out);

}  // namespace cohort::comm
