#include "worker/comm/store/tcp_store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "worker/comm/store/store_wait.h"
#include "worker/comm/store/tcp_socket.h"

namespace cohort::comm {
namespace {

// With no waiter pending the loop still wakes this often; it has nothing to do then, but no
// wait in cohort is unbounded.
constexpr Duration kServerIdlePollInterval = std::chrono::seconds(1);
// Bytes read from a connection per recv call.
constexpr size_t kReadChunkBytes = 64 * 1024;

}  // namespace

struct TcpStoreServer::Connection {
  ScopedFd fd;
  std::string in;       // received bytes not yet handled
  std::string out;      // reply bytes not yet sent
  bool parked = false;  // a get/wait of this connection is a waiter; later requests queue in `in`
  bool closed = false;  // dropped at the end of the loop iteration (its fd stays reserved till then)
};

struct TcpStoreServer::Waiter {
  int fd;
  TcpStoreOp op;  // kGet or kWait
  std::vector<std::string> keys;
  Clock::time_point deadline;
};

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::start(const TcpStoreServerOptions& options) {
  const std::string where = format_host_port(options.host.empty() ? "*" : options.host, options.port);
  StatusOr<ScopedFd> listener = listen_tcp(options.host, options.port);
  if (!listener.ok()) {
    return unavailable_error(
        "tcp store server: cannot listen on {}: {}; is another job (or an earlier run) using it? Choose a "
        "free port",
        where, listener.status().message());
  }
  COHORT_ASSIGN_OR_RETURN(int port, bound_port(listener->get()));
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0)
    return errno_status("pipe2", errno).with_context("tcp store server");
  std::unique_ptr<TcpStoreServer> server(
      new TcpStoreServer(std::move(listener).value(), port, ScopedFd(wake[0]), ScopedFd(wake[1])));
  server->thread_ = std::thread(&TcpStoreServer::serve, server.get());
  return server;
}

TcpStoreServer::TcpStoreServer(ScopedFd listener, int port, ScopedFd wake_read, ScopedFd wake_write)
    : port_(port),
      listener_(std::move(listener)),
      wake_read_(std::move(wake_read)),
      wake_write_(std::move(wake_write)) {}

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
  while (true) {
    polled.clear();
    polled.push_back({wake_read_.get(), POLLIN, 0});
    polled.push_back({listener_.get(), POLLIN, 0});
    for (const auto& [fd, connection] : connections_) {
      polled.push_back({fd, static_cast<short>(POLLIN | (connection->out.empty() ? 0 : POLLOUT)), 0});
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
        if (polled[i].revents & POLLOUT) flush(*it->second);
        if (!it->second->closed && (polled[i].revents & (POLLIN | POLLHUP | POLLERR))) read_from(*it->second);
      }
    }
    complete_waiters();  // the timed-out ones
    resume_parked_connections();
    for (auto it = connections_.begin(); it != connections_.end();) {
      it = it->second->closed ? connections_.erase(it) : std::next(it);
    }
  }
  waiters_.clear();
  connections_.clear();  // closes every client socket: their calls fail with UNAVAILABLE
  listener_.reset();
}

int TcpStoreServer::poll_timeout_ms() const {
  Clock::time_point wake_at = Clock::now() + kServerIdlePollInterval;
  for (const Waiter& waiter : waiters_) wake_at = std::min(wake_at, waiter.deadline);
  const auto left = std::chrono::ceil<Duration>(wake_at - Clock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 0));
}

void TcpStoreServer::accept_connections() {
  while (true) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: none left; anything else (EMFILE, a reset) is the client's problem
    set_no_delay(fd);
    auto connection = std::make_unique<Connection>();
    connection->fd.reset(fd);
    connections_[fd] = std::move(connection);
  }
}

void TcpStoreServer::read_from(Connection& connection) {
  char chunk[kReadChunkBytes];
  while (true) {
    const ssize_t n = ::recv(connection.fd.get(), chunk, sizeof(chunk), 0);
    if (n > 0) {
      connection.in.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_connection(connection);  // EOF or a reset: the client is gone
    return;
  }
  handle_requests(connection);
  flush(connection);
}

void TcpStoreServer::flush(Connection& connection) {
  while (!connection.closed && !connection.out.empty()) {
    const ssize_t n = ::send(connection.fd.get(), connection.out.data(), connection.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      connection.out.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // poll reports POLLOUT when the client drains its socket
    } else {
      close_connection(connection);
    }
  }
}

void TcpStoreServer::close_connection(Connection& connection) {
  connection.closed = true;
  const int fd = connection.fd.get();
  waiters_.erase(
      std::remove_if(waiters_.begin(), waiters_.end(), [fd](const Waiter& w) { return w.fd == fd; }),
      waiters_.end());
}

void TcpStoreServer::handle_requests(Connection& connection) {
  while (!connection.closed && !connection.parked && connection.in.size() >= kTcpStoreFrameHeaderBytes) {
    StatusOr<uint32_t> length = tcp_store_frame_length(connection.in);
    if (!length.ok()) {
      close_connection(connection);  // not our protocol: the stream cannot be resynchronised
      return;
    }
    if (connection.in.size() < kTcpStoreFrameHeaderBytes + *length) return;
    const std::string body = connection.in.substr(kTcpStoreFrameHeaderBytes, *length);
    connection.in.erase(0, kTcpStoreFrameHeaderBytes + *length);
    handle_request(connection, body);
  }
}

void TcpStoreServer::handle_request(Connection& connection, std::string_view body) {
  WireReader args(body);
  uint8_t op = 0;
  std::string key, value, expected;
  std::vector<std::string> keys;
  int64_t number = 0;
  uint32_t magic = 0, version = 0;
  args.u8(&op);
  switch (static_cast<TcpStoreOp>(op)) {
    case TcpStoreOp::kHello:
      if (!args.u32(&magic) || !args.u32(&version)) break;
      if (magic != kTcpStoreMagic || version != kTcpStoreProtocolVersion) {
        return reply_error(
            connection,
            failed_precondition_error("client speaks protocol {:#x}/v{}, this server {:#x}/v{}; run the same "
                                      "cohort version on every rank",
                                      magic, version, kTcpStoreMagic, kTcpStoreProtocolVersion));
      }
      return reply_ok(connection, WireWriter());
    case TcpStoreOp::kSet:
      if (!args.str(&key) || !args.str(&value)) break;
      table_.set(key, value);
      reply_ok(connection, WireWriter());
      return complete_waiters();
    case TcpStoreOp::kGet:
      if (!args.str(&key) || !args.i64(&number)) break;
      return start_wait(connection, TcpStoreOp::kGet, {key}, number);
    case TcpStoreOp::kAdd: {
      if (!args.str(&key) || !args.i64(&number)) break;
      StatusOr<int64_t> sum = table_.add(key, number);
      if (!sum.ok()) return reply_error(connection, sum.status());
      reply_ok(connection, WireWriter().i64(*sum));
      return complete_waiters();
    }
    case TcpStoreOp::kCompareSet:
      if (!args.str(&key) || !args.str(&expected) || !args.str(&value)) break;
      reply_ok(connection, WireWriter().str(table_.compare_set(key, expected, value)));
      return complete_waiters();
    case TcpStoreOp::kWait:
      if (!args.strs(&keys) || !args.i64(&number)) break;
      return start_wait(connection, TcpStoreOp::kWait, std::move(keys), number);
    case TcpStoreOp::kCheck:
      if (!args.strs(&keys)) break;
      return reply_ok(connection, WireWriter().u8(table_.contains_all(keys) ? 1 : 0));
    case TcpStoreOp::kDelete:
      if (!args.str(&key)) break;
      return reply_ok(connection, WireWriter().u8(table_.erase(key) ? 1 : 0));
    case TcpStoreOp::kNumKeys:
      return reply_ok(connection, WireWriter().i64(table_.size()));
  }
  // Frames are length-delimited, so a malformed body spoils only itself: answer and carry on.
  reply_error(connection, invalid_argument_error("malformed request: op {} with {} bytes", op, body.size()));
}

void TcpStoreServer::start_wait(Connection& connection, TcpStoreOp op, std::vector<std::string> keys,
                                int64_t timeout_ms) {
  Waiter waiter{connection.fd.get(), op, std::move(keys),
                Clock::now() + clamp_store_timeout(Duration(std::max<int64_t>(timeout_ms, 0)))};
  if (table_.contains_all(waiter.keys)) return reply_waiter(connection, waiter, /*timed_out=*/false);
  if (timeout_ms <= 0) return reply_waiter(connection, waiter, /*timed_out=*/true);
  connection.parked = true;
  waiters_.push_back(std::move(waiter));
}

void TcpStoreServer::complete_waiters() {
  const Clock::time_point now = Clock::now();
  for (size_t i = 0; i < waiters_.size();) {
    const bool present = table_.contains_all(waiters_[i].keys);
    if (!present && now < waiters_[i].deadline) {
      ++i;
      continue;
    }
    const Waiter waiter = std::move(waiters_[i]);
    waiters_.erase(waiters_.begin() + static_cast<std::ptrdiff_t>(i));
    auto it = connections_.find(waiter.fd);
    if (it == connections_.end() || it->second->closed) continue;
    reply_waiter(*it->second, waiter, /*timed_out=*/!present);
    flush(*it->second);
    resumable_.push_back(waiter.fd);
  }
}

void TcpStoreServer::reply_waiter(Connection& connection, const Waiter& waiter, bool timed_out) {
  connection.parked = false;
  if (timed_out)
    return reply_error(connection, deadline_exceeded_error("timed out"), table_.missing(waiter.keys));
  if (waiter.op == TcpStoreOp::kGet)
    return reply_ok(connection, WireWriter().str(*table_.find(waiter.keys[0])));
  reply_ok(connection, WireWriter());
}

void TcpStoreServer::reply_ok(Connection& connection, const WireWriter& result) {
  std::string body(1, static_cast<char>(StatusCode::kOk));
  body += result.bytes();
  connection.out += tcp_store_frame(body);
}

void TcpStoreServer::reply_error(Connection& connection, const Status& status,
                                 const std::vector<std::string>& missing) {
  const std::string body =
      WireWriter().u8(static_cast<uint8_t>(status.code())).str(status.message()).strs(missing).take();
  connection.out += tcp_store_frame(body);
}

void TcpStoreServer::resume_parked_connections() {
  // Handling one connection's queued requests may answer other waiters and add to the list.
  while (!resumable_.empty()) {
    const int fd = resumable_.back();
    resumable_.pop_back();
    auto it = connections_.find(fd);
    if (it == connections_.end() || it->second->closed) continue;
    handle_requests(*it->second);
    flush(*it->second);
  }
}

}  // namespace cohort::comm
