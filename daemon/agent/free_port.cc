#include "daemon/agent/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cohort::agent {

StatusOr<int> pick_free_port(const std::string& host) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!host.empty() && inet_pton(AF_INET, host.c_str(), &address.sin_addr) != 1) {
    return invalid_argument_error("pick_free_port: {:?} is not an IPv4 address", host);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return unavailable_error("pick_free_port: socket() failed: {}", std::strerror(errno));
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    ::close(fd);
    return unavailable_error("pick_free_port: bind({}:0) failed: {}", host.empty() ? "0.0.0.0" : host,
                             std::strerror(error));
  }
  ::close(fd);
  return static_cast<int>(ntohs(address.sin_port));
}

}  // namespace cohort::agent
