#include "worker/comm/store/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace cohort::comm {
namespace {

// Pending connections the kernel queues before accept: a whole job's ranks may connect at once.
constexpr int kListenBacklog = 1024;

using AddrInfoPtr = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

StatusOr<AddrInfoPtr> resolve(const std::string& host, int port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    return invalid_argument_error("cannot resolve host {:?}: {}", host, ::gai_strerror(rc));
  }
  return AddrInfoPtr(found, &freeaddrinfo);
}

int poll_timeout_ms(const Deadline& deadline) {
  // Round up so a wait with 0.4 ms left still sleeps instead of spinning.
  return static_cast<int>(std::min<int64_t>(deadline.remaining().count() + 1, 1 << 30));
}

// Waits for `events` on `fd`. false when the deadline passed first.
StatusOr<bool> wait_for(int fd, short events, const Deadline& deadline) {
  while (true) {
    pollfd entry{fd, events, 0};
    const int rc = ::poll(&entry, 1, deadline.expired() ? 0 : poll_timeout_ms(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return errno_status("poll", errno);
    if (rc > 0) return true;
    if (deadline.expired()) return false;
  }
}

// Finishes a non-blocking connect that returned EINPROGRESS.
Status finish_connect(int fd, const Deadline& deadline) {
  COHORT_ASSIGN_OR_RETURN(bool ready, wait_for(fd, POLLOUT, deadline));
  if (!ready)
    return deadline_exceeded_error("connect: no answer within {}", format_duration(deadline.budget()));
  int error = 0;
  socklen_t size = sizeof(error);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) return errno_status("getsockopt", errno);
  return error == 0 ? ok_status() : errno_status("connect", error);
}

StatusOr<ScopedFd> connect_one(const addrinfo& address, const Deadline& deadline) {
  ScopedFd fd(
      ::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, address.ai_protocol));
  if (!fd.valid()) return errno_status("socket", errno);
  if (::connect(fd.get(), address.ai_addr, address.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return errno_status("connect", errno);
    COHORT_RETURN_IF_ERROR(finish_connect(fd.get(), deadline));
  }
  set_no_delay(fd.get());
  return fd;
}

StatusOr<ScopedFd> listen_on(int family, const sockaddr* address, socklen_t size) {
  ScopedFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno_status("socket", errno);
  // Lets a restarted server rebind its port while old connections sit in TIME_WAIT.
  const int on = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (family == AF_INET6) {
    const int off = 0;  // dual-stack: IPv4 clients too
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
  }
  if (::bind(fd.get(), address, size) != 0) return errno_status("bind", errno);
  if (::listen(fd.get(), kListenBacklog) != 0) return errno_status("listen", errno);
  return fd;
}

StatusOr<ScopedFd> listen_any(int port) {
  sockaddr_in6 any6{};
  any6.sin6_family = AF_INET6;
  any6.sin6_addr = in6addr_any;
  any6.sin6_port = htons(static_cast<uint16_t>(port));
  StatusOr<ScopedFd> fd = listen_on(AF_INET6, reinterpret_cast<const sockaddr*>(&any6), sizeof(any6));
  if (fd.ok()) return fd;
  // No IPv6 in this kernel or container: IPv4 only.
  sockaddr_in any4{};
  any4.sin_family = AF_INET;
  any4.sin_addr.s_addr = htonl(INADDR_ANY);
  any4.sin_port = htons(static_cast<uint16_t>(port));
  return listen_on(AF_INET, reinterpret_cast<const sockaddr*>(&any4), sizeof(any4));
}

}  // namespace

std::string format_host_port(std::string_view host, int port) {
  if (host.find(':') != std::string_view::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

StatusOr<ScopedFd> connect_tcp(const std::string& host, int port, Deadline deadline) {
  COHORT_ASSIGN_OR_RETURN(AddrInfoPtr addresses, resolve(host, port, AI_ADDRCONFIG));
  Status last = unavailable_error("no address for {:?}", host);
  for (const addrinfo* address = addresses.get(); address != nullptr; address = address->ai_next) {
    StatusOr<ScopedFd> fd = connect_one(*address, deadline);
    if (fd.ok()) return fd;
    last = fd.status();
  }
  return last;
}

StatusOr<ScopedFd> listen_tcp(const std::string& host, int port) {
  if (host.empty()) return listen_any(port);
  COHORT_ASSIGN_OR_RETURN(AddrInfoPtr addresses, resolve(host, port, AI_PASSIVE));
  Status last = unavailable_error("no address for {:?}", host);
  for (const addrinfo* address = addresses.get(); address != nullptr; address = address->ai_next) {
    StatusOr<ScopedFd> fd = listen_on(address->ai_family, address->ai_addr, address->ai_addrlen);
    if (fd.ok()) return fd;
    last = fd.status();
  }
  return last;
}

std::string peer_address(int fd) {
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (address.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  } else if (address.ss_family == AF_INET) {
    const auto* in4 = reinterpret_cast<const sockaddr_in*>(&address);
    ::inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
    port = ntohs(in4->sin_port);
  }
  return format_host_port(host, port);
}

StatusOr<int> bound_port(int fd) {
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0)
    return errno_status("getsockname", errno);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
}

Status set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return errno_status("fcntl(O_NONBLOCK)", errno);
  return ok_status();
}

void set_no_delay(int fd) {
  const int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

Status send_all(int fd, std::string_view data, Deadline deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("send", errno);
    COHORT_ASSIGN_OR_RETURN(bool ready, wait_for(fd, POLLOUT, deadline));
    if (!ready)
      return deadline_exceeded_error("send: the peer took no data for {}",
                                     format_duration(deadline.budget()));
  }
  return ok_status();
}

Status recv_exact(int fd, size_t size, Deadline deadline, std::string* out) {
  out->resize(size);
  size_t received = 0;
  while (received < size) {
    const ssize_t n = ::recv(fd, out->data() + received, size - received, 0);
    if (n > 0) {
      received += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return unavailable_error("the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("recv", errno);
    COHORT_ASSIGN_OR_RETURN(bool ready, wait_for(fd, POLLIN, deadline));
    if (!ready)
      return deadline_exceeded_error("recv: no reply within {}", format_duration(deadline.budget()));
  }
  return ok_status();
}

}  // namespace cohort::comm
