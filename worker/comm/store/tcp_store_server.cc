#include "worker/comm/store/tcp_store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <spdlog/spdlog.h>

#include "worker/comm/store/tcp_socket.h"
#include "worker/comm/store/tcp_store_auth.h"

namespace cohort::comm {
namespace {

// With nothing due the loop still wakes this often; no wait in cohort is unbounded.
constexpr Duration kServerIdlePollInterval = std::chrono::seconds(1);
// Bytes read from a connection per recv call.
constexpr size_t kReadChunkBytes = 64 * 1024;
// Bytes read from one connection per loop iteration, so one fast sender cannot starve the rest
// (and the service sees a huge length prefix after the first chunk).
constexpr size_t kMaxReadBytesPerIteration = 4 * kReadChunkBytes;
// Connections accepted per loop iteration: a flood of connects cannot keep the loop from reading
// the handshakes of the connections it already has.
constexpr int kMaxAcceptsPerIteration = 32;
// How long accept() is left alone after it ran out of file descriptors.
constexpr Duration kAcceptPauseOnFdExhaustion = std::chrono::milliseconds(100);
// Warnings about clients: at most this many per window, then one line with the count.
constexpr int kMaxClientWarningsPerWindow = 20;
constexpr Duration kClientWarningWindow = std::chrono::seconds(10);
// File descriptors of the process's RLIMIT_NOFILE left for everything but store connections.
constexpr size_t kFdLimitShareDivisor = 2;

size_t connection_limit(size_t requested) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return requested;
  return std::max<size_t>(1, std::min<size_t>(requested, limit.rlim_cur / kFdLimitShareDivisor));
}

}  // namespace

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const TcpStoreServerOptions& options) {
  const std::string where = format_host_port(options.host.empty() ? "*" : options.host, options.port);
  StatusOr<ScopedFd> listener = listen_tcp(options.host, options.port);
  if (!listener.ok()) {
    return unavailable_error(
        "tcp store server: cannot listen on {}: {}; is another job (or an earlier run) using it? Choose a "
        "free port; the host (MASTER_ADDR) must be an address of this machine",
        where, listener.status().message());
  }
  COHORT_ASSIGN_OR_RETURN(int port, bound_port(listener->get()));
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0)
    return errno_status("pipe2", errno).with_context("tcp store server");
  const std::string bound = format_host_port(options.host.empty() ? "*" : options.host, port);
  if (options.service.secret.empty()) {
    spdlog::warn(
        "tcp store server on {}: no job secret ({} is unset), so any client that reaches this address can read "
        "and write the store; keep it on a trusted network, or set {} to the same random string on every rank",
        bound, kJobSecretEnvironmentVariable, kJobSecretEnvironmentVariable);
  }
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer(options, bound, std::move(listener).value(), port,
                                                            ScopedFd(wake[0]), ScopedFd(wake[1]),
                                                            connection_limit(options.max_connections)));
  server->thread_ = std::thread(&TcpStoreServer::serve, server.get());
  return server;
}

TcpStoreServer::TcpStoreServer(const TcpStoreServerOptions& options, std::string where, ScopedFd listener,
                               int port, ScopedFd wake_read, ScopedFd wake_write, size_t max_connections)
    : where_(std::move(where)),
      port_(port),
      max_connections_(max_connections),
      listener_(std::move(listener)),
      wake_read_(std::move(wake_read)),
      wake_write_(std::move(wake_write)),
      service_(options.service) {}

TcpStoreServer::~TcpStoreServer() { stop(); }

void TcpStoreServer::stop() {
  std::lock_guard<std::mutex> lock(stop_mutex_);
  if (!thread_.joinable()) return;
  const char byte = 0;
  while (::write(wake_write_.get(), &byte, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
}

void TcpStoreServer::serve() {
  std::vector<pollfd> polled;
  std::vector<int> ready_fds;
  while (true) {
    polled.clear();
    polled.push_back({wake_read_.get(), POLLIN, 0});
    const bool accepting = Clock::now() >= accept_paused_until_;
    polled.push_back({accepting ? listener_.get() : -1, POLLIN, 0});
    for (const auto& [fd, connection] : connections_) {
      const short events = POLLIN | (service_.has_output(connection.id) ? POLLOUT : 0);
      polled.push_back({fd, events, 0});
    }
    const int ready = ::poll(polled.data(), polled.size(), poll_timeout_ms());
    // poll fails only on EINTR or on resource exhaustion; for the latter, closing every connection
    // (clients see UNAVAILABLE) beats spinning.
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0) {
      if (polled[0].revents != 0) break;  // stop()
      if (polled[1].revents & POLLIN) accept_connections();
      for (size_t i = 2; i < polled.size(); ++i) {
        auto it = connections_.find(polled[i].fd);
        if (polled[i].revents == 0 || it == connections_.end()) continue;
        if (polled[i].revents & POLLOUT) flush(it->second);
        if (!service_.is_open(it->second.id)) continue;
        if (polled[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(it->second);
      }
    }
    service_.on_tick(Clock::now());  // timed-out waiters and handshakes
    close_dropped();
    // Replies a mutation queued on other connections (their waiters) go out now.
    for (auto it = connections_.begin(); it != connections_.end();) {
      const int fd = (it++)->first;
      auto current = connections_.find(fd);
      if (current != connections_.end() && service_.has_output(current->second.id)) flush(current->second);
    }
    close_dropped();
  }
  connections_.clear();  // closes every client socket: their calls fail with UNAVAILABLE
  listener_.reset();
}

int TcpStoreServer::poll_timeout_ms() const {
  const Clock::time_point now = Clock::now();
  Clock::time_point wake_at = service_.next_deadline(now + kServerIdlePollInterval);
  if (now < accept_paused_until_) wake_at = std::min(wake_at, accept_paused_until_);
  const auto left = std::chrono::ceil<Duration>(wake_at - now);
  return static_cast<int>(std::max<int64_t>(left.count(), 0));
}

void TcpStoreServer::accept_connections() {
  for (int i = 0; i < kMaxAcceptsPerIteration; ++i) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        // The pending connection stays in the backlog and the listener stays readable: leave it
        // alone for a moment instead of spinning.
        accept_paused_until_ = Clock::now() + kAcceptPauseOnFdExhaustion;
        warn_client("?", fmt::format("cannot accept a connection: {} (the process's RLIMIT_NOFILE)",
                                     std::strerror(errno)));
      }
      return;  // EAGAIN: none left; a reset is the client's problem
    }
    ScopedFd socket(fd);
    if (connections_.size() >= max_connections_) {
      warn_client(peer_address(fd), fmt::format("refused: {} connections are open, the limit "
                                                "(kTcpStoreMaxConnections, or half of RLIMIT_NOFILE)",
                                                max_connections_));
      continue;  // closes it
    }
    set_no_delay(fd);
    Connection connection{std::move(socket), service_.open(Clock::now()), peer_address(fd)};
    fds_[connection.id] = fd;
    connections_.emplace(fd, std::move(connection));
    close_dropped();  // opening may have dropped the oldest connection still in its handshake
  }
}

void TcpStoreServer::read_from(Connection& connection) {
  char chunk[kReadChunkBytes];
  const int fd = connection.fd.get();
  for (size_t total = 0; total < kMaxReadBytesPerIteration;) {
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n > 0) {
      total += static_cast<size_t>(n);
      service_.on_bytes(connection.id, std::string_view(chunk, static_cast<size_t>(n)), Clock::now());
      if (!service_.is_open(connection.id)) return;  // dropped: close_dropped() closes it
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_connection(fd);  // EOF or a reset: the client is gone
    return;
  }
  flush(connection);
}

void TcpStoreServer::flush(Connection& connection) {
  while (true) {
    const std::string_view out = service_.output(connection.id);
    if (out.empty()) return;
    const ssize_t n = ::send(connection.fd.get(), out.data(), out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      service_.consume_output(connection.id, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // poll reports POLLOUT when the client drains its socket
    } else {
      return close_connection(connection.fd.get());
    }
  }
}

void TcpStoreServer::close_connection(int fd) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  service_.close(it->second.id);
  fds_.erase(it->second.id);
  connections_.erase(it);
}

void TcpStoreServer::close_dropped() {
  for (TcpStoreService::Dropped& dropped : service_.take_dropped()) {
    auto fd = fds_.find(dropped.id);
    if (fd == fds_.end()) continue;
    auto it = connections_.find(fd->second);
    if (it != connections_.end()) {
      // One non-blocking attempt: the reply (e.g. UNAUTHENTICATED) tells an honest client why.
      if (!dropped.final_output.empty()) {
        const ssize_t sent = ::send(it->first, dropped.final_output.data(), dropped.final_output.size(),
                                    MSG_NOSIGNAL | MSG_DONTWAIT);
        static_cast<void>(sent);
      }
      warn_client(it->second.peer, fmt::format("disconnected: {}", dropped.reason.to_string()));
      connections_.erase(it);
    }
    fds_.erase(fd);
  }
}

void TcpStoreServer::warn_client(const std::string& peer, const std::string& what) {
  const Clock::time_point now = Clock::now();
  if (now - warning_window_start_ >= kClientWarningWindow) {
    if (warnings_suppressed_ > 0) {
      spdlog::warn("tcp store server on {}: {} more warnings about clients suppressed", where_,
                   warnings_suppressed_);
    }
    warning_window_start_ = now;
    warnings_in_window_ = 0;
    warnings_suppressed_ = 0;
  }
  if (warnings_in_window_ >= kMaxClientWarningsPerWindow) {
    ++warnings_suppressed_;
    return;
  }
  ++warnings_in_window_;
  spdlog::warn("tcp store server on {}: client {} {}", where_, peer, what);
}

}  // namespace cohort::comm
