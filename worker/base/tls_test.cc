// make_channel's channels against a raw HTTP/2 peer that ends a call with trailers that carry no
// grpc-status, as a server killed mid-call can (the HA chaos test's cleanup SIGTERMs etcd and
// cohortd together). gRPC 1.51's retry filter, on by default, dereferences the missing status and
// aborts the process (absl optional<grpc_status_code> "this->engaged_" assertion, grpc/grpc#34683);
// make_channel turns retries off, so the call fails with a status instead.

#include "worker/base/tls.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/info.grpc.pb.h"

namespace cohort::tls {
namespace {

bool read_exactly(int fd, uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, out + got, n - got);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

std::string frame(uint8_t type, uint8_t flags, uint32_t stream, const std::string& payload) {
  std::string out;
  const uint32_t length = static_cast<uint32_t>(payload.size());
  out.push_back(static_cast<char>((length >> 16) & 0xff));
  out.push_back(static_cast<char>((length >> 8) & 0xff));
  out.push_back(static_cast<char>(length & 0xff));
  out.push_back(static_cast<char>(type));
  out.push_back(static_cast<char>(flags));
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((stream >> shift) & 0xff));
  return out + payload;
}

// Accepts one connection, answers the first request stream with a trailers-only response that has
// ":status: 200" and "content-type: application/grpc" but no grpc-status, then holds the
// connection open until the client closes it.
class NoStatusPeer {
 public:
  NoStatusPeer() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 4), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~NoStatusPeer() {
    // The channel's connection may outlive the stub (gRPC pools subchannels): end it from here.
    ::shutdown(listen_fd_, SHUT_RDWR);
    const int fd = conn_fd_.load();
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    thread_.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  bool answered() const { return answered_; }

 private:
  void serve() {
    const int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) return;
    conn_fd_ = fd;
    uint8_t preface[24];
    if (read_exactly(fd, preface, sizeof(preface))) {
      std::string out = frame(0x4, 0, 0, "");  // the server's SETTINGS
      (void)!::write(fd, out.data(), out.size());
      while (true) {
        uint8_t header[9];
        if (!read_exactly(fd, header, sizeof(header))) break;
        const size_t length = (size_t{header[0]} << 16) | (size_t{header[1]} << 8) | header[2];
        const uint8_t type = header[3];
        const uint8_t flags = header[4];
        const uint32_t stream = ((uint32_t{header[5]} & 0x7f) << 24) | (uint32_t{header[6]} << 16) |
                                (uint32_t{header[7]} << 8) | header[8];
        std::string payload(length, '\0');
        if (length > 0 && !read_exactly(fd, reinterpret_cast<uint8_t*>(payload.data()), length)) break;
        if (type == 0x4 && (flags & 0x1) == 0) {
          out = frame(0x4, 0x1, 0, "");  // SETTINGS ACK
          (void)!::write(fd, out.data(), out.size());
        }
        if (type == 0x1 && !answered_) {
          // HPACK: ":status: 200" (static index 8), then "content-type" (static index 31) as a
          // literal without indexing with value "application/grpc". No grpc-status.
          std::string block = "\x88";
          block += "\x0f\x10";
          block += static_cast<char>(16);
          block += "application/grpc";
          out = frame(0x1, 0x1 | 0x4, stream, block);  // END_STREAM | END_HEADERS
          (void)!::write(fd, out.data(), out.size());
          answered_ = true;
        }
      }
    }
    conn_fd_ = -1;
    ::close(fd);
  }

  int listen_fd_ = -1;
  std::atomic<int> conn_fd_{-1};
  int port_ = 0;
  std::atomic<bool> answered_{false};
  std::thread thread_;
};

TEST(MakeChannelTest, TrailersWithoutGrpcStatusFailTheCallInsteadOfAborting) {
  NoStatusPeer peer;
  ChannelSecurity security;
  security.insecure = true;
  auto stub = cohort::v1::Info::NewStub(make_channel("127.0.0.1:" + std::to_string(peer.port()), security));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  cohort::v1::GetVersionRequest request;
  cohort::v1::VersionInfo info;
  const grpc::Status status = stub->GetVersion(&context, request, &info);
  EXPECT_TRUE(peer.answered()) << "the peer never saw the request: " << status.error_message();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
}

}  // namespace
}  // namespace cohort::tls
