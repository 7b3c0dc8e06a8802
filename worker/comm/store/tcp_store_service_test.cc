// TcpStoreService on byte buffers, no sockets: the handshake (right secret, wrong secret, no
// answer, ops before hello), framing limits (a 4 GiB length prefix), per-connection buffering,
// unread replies, the store's key and byte limits, and handshake shedding and timeouts.

#include "worker/comm/store/tcp_store_service.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/comm/store/tcp_store_auth.h"
#include "worker/comm/store/tcp_store_protocol.h"
#include "worker/comm/store/wire_format.h"

namespace cohort::comm {
namespace {

constexpr const char* kSecret = "job-secret-for-tests";

WireWriter op(TcpStoreOp code) { return std::move(WireWriter().u8(static_cast<uint8_t>(code))); }

std::string hello_frame() {
  return tcp_store_frame(op(TcpStoreOp::kHello).u32(kTcpStoreMagic).u32(kTcpStoreProtocolVersion).take());
}

// Drives one service as a test client would, on a fixed clock.
class ServiceClient {
 public:
  explicit ServiceClient(TcpStoreService& service) : service_(service), id_(service.open(now_)) {}

  TcpStoreService::ConnectionId id() const { return id_; }

  void send(std::string_view bytes) { service_.on_bytes(id_, bytes, now_); }

  // The next complete reply body, consuming it; "" when none is queued.
  std::string reply() {
    while (true) {
      const std::string_view out = service_.output(id_);
      if (out.empty()) break;
      received_.append(out);
      service_.consume_output(id_, out.size());
    }
    if (received_.size() < kTcpStoreFrameHeaderBytes) return "";
    const uint32_t length = tcp_store_frame_length(received_).value();
    if (received_.size() < kTcpStoreFrameHeaderBytes + length) return "";
    std::string body = received_.substr(kTcpStoreFrameHeaderBytes, length);
    received_.erase(0, kTcpStoreFrameHeaderBytes + length);
    return body;
  }

  std::string call(const std::string& body) {
    send(tcp_store_frame(body));
    return reply();
  }

  // hello, then (when challenged) the answer `secret` gives. Returns the last reply's code.
  StatusCode handshake(std::string_view secret) {
    std::string body = call(op(TcpStoreOp::kHello).u32(kTcpStoreMagic).u32(kTcpStoreProtocolVersion).take());
    if (body.empty() || static_cast<StatusCode>(body[0]) != StatusCode::kOk) return StatusCode::kUnknown;
    WireReader result(std::string_view(body).substr(1));
    uint8_t required = 0;
    std::string nonce;
    if (!result.u8(&required) || !result.str(&nonce)) return StatusCode::kUnknown;
    if (required == 0) return StatusCode::kOk;
    body = call(op(TcpStoreOp::kAuth).str(tcp_store_auth_response(secret, nonce)).take());
    return body.empty() ? StatusCode::kUnknown : static_cast<StatusCode>(body[0]);
  }

  Clock::time_point now_ = Clock::time_point() + std::chrono::hours(1);

 private:
  TcpStoreService& service_;
  TcpStoreService::ConnectionId id_;
  std::string received_;
};

StatusCode code_of(const std::string& reply) {
  return reply.empty() ? StatusCode::kUnknown : static_cast<StatusCode>(reply[0]);
}

std::string reason_of(TcpStoreService& service, TcpStoreService::ConnectionId id) {
  for (const auto& dropped : service.take_dropped()) {
    if (dropped.id == id) return dropped.reason.to_string();
  }
  return "";
}

TEST(TcpStoreServiceTest, TheRightSecretOpensTheStore) {
  TcpStoreService service(TcpStoreServiceOptions{kSecret});
  ServiceClient client(service);
  ASSERT_EQ(client.handshake(kSecret), StatusCode::kOk);
  EXPECT_TRUE(service.is_authenticated(client.id()));
  EXPECT_EQ(code_of(client.call(op(TcpStoreOp::kSet).str("k").str("v").take())), StatusCode::kOk);
  const std::string got = client.call(op(TcpStoreOp::kGet).str("k").i64(0).take());
  ASSERT_EQ(code_of(got), StatusCode::kOk);
  std::string value;
  EXPECT_TRUE(WireReader(std::string_view(got).substr(1)).str(&value));
  EXPECT_EQ(value, "v");
}

TEST(TcpStoreServiceTest, AWrongSecretIsRefusedAndDisconnected) {
  TcpStoreService service(TcpStoreServiceOptions{kSecret});
  ServiceClient client(service);
  EXPECT_EQ(client.handshake("not-the-secret"), StatusCode::kUnknown);  // the reply left with the drop
  EXPECT_FALSE(service.is_open(client.id()));
  const auto dropped = service.take_dropped();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].reason.code(), StatusCode::kUnauthenticated);
  // The client is told why before the server closes.
  ASSERT_GT(dropped[0].final_output.size(), kTcpStoreFrameHeaderBytes);
  EXPECT_EQ(static_cast<StatusCode>(dropped[0].final_output[kTcpStoreFrameHeaderBytes]),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(service.table().size(), 0);
}

TEST(TcpStoreServiceTest, OperationsWithoutTheHandshakeAreRefused) {
  TcpStoreService service(TcpStoreServiceOptions{kSecret});
  ServiceClient no_hello(service);
  no_hello.send(tcp_store_frame(op(TcpStoreOp::kSet).str("k").str("v").take()));
  EXPECT_FALSE(service.is_open(no_hello.id()));
  EXPECT_NE(reason_of(service, no_hello.id()).find("UNAUTHENTICATED"), std::string::npos);

  // Hello but a set instead of the answer.
  ServiceClient no_answer(service);
  no_answer.send(hello_frame());
  no_answer.send(tcp_store_frame(op(TcpStoreOp::kSet).str("k").str("v").take()));
  EXPECT_FALSE(service.is_open(no_answer.id()));
  EXPECT_EQ(service.table().size(), 0);
}

TEST(TcpStoreServiceTest, WithoutASecretHelloSuffices) {
  TcpStoreService service(TcpStoreServiceOptions{});
  ServiceClient client(service);
  EXPECT_EQ(client.handshake(""), StatusCode::kOk);
  EXPECT_EQ(code_of(client.call(op(TcpStoreOp::kNumKeys).take())), StatusCode::kOk);
}

TEST(TcpStoreServiceTest, AFourGibLengthPrefixIsRefusedFromItsHeader) {
  TcpStoreService service(TcpStoreServiceOptions{kSecret});
  ServiceClient before_auth(service);
  before_auth.send(WireWriter().u32(0xffffffffu).take());
  EXPECT_FALSE(service.is_open(before_auth.id()));
  EXPECT_NE(reason_of(service, before_auth.id()).find("kTcpStoreMaxHandshakeFrameBytes"), std::string::npos);

  ServiceClient after_auth(service);
  ASSERT_EQ(after_auth.handshake(kSecret), StatusCode::kOk);
  after_auth.send(WireWriter().u32(0xffffffffu).take());
  EXPECT_FALSE(service.is_open(after_auth.id()));
  EXPECT_NE(reason_of(service, after_auth.id()).find("kTcpStoreMaxFrameBytes"), std::string::npos);
  EXPECT_EQ(service.buffered_bytes(), 0u);
}

TEST(TcpStoreServiceTest, BytesAheadOfTheRepliesAreCapped) {
  TcpStoreServiceOptions options{kSecret};
  options.max_buffered_bytes_per_connection = 1024;
  TcpStoreService service(options);
  ServiceClient client(service);
  ASSERT_EQ(client.handshake(kSecret), StatusCode::kOk);
  // A get that parks, then more requests behind it: they wait in the input buffer.
  client.send(tcp_store_frame(op(TcpStoreOp::kGet).str("missing").i64(60'000).take()));
  ASSERT_TRUE(service.is_open(client.id()));
  const std::string set = tcp_store_frame(op(TcpStoreOp::kSet).str("k").str(std::string(100, 'x')).take());
  for (int i = 0; i < 20 && service.is_open(client.id()); ++i) client.send(set);
  EXPECT_FALSE(service.is_open(client.id()));
  EXPECT_NE(reason_of(service, client.id()).find("kTcpStoreMaxBufferedBytesPerConnection"), std::string::npos);
  EXPECT_EQ(service.buffered_bytes(), 0u);
}

TEST(TcpStoreServiceTest, PipelinedGetsThatAreNeverReadAreDisconnected) {
  TcpStoreService service(TcpStoreServiceOptions{kSecret});
  ServiceClient setter(service);
  ASSERT_EQ(setter.handshake(kSecret), StatusCode::kOk);
  ASSERT_EQ(code_of(setter.call(op(TcpStoreOp::kSet).str("k").str("value").take())), StatusCode::kOk);

  ServiceClient reader(service);
  ASSERT_EQ(reader.handshake(kSecret), StatusCode::kOk);
  std::string batch;
  for (size_t i = 0; i <= kTcpStoreMaxQueuedReplies; ++i) batch += tcp_store_frame(op(TcpStoreOp::kGet).str("k").i64(0).take());
  reader.send(batch);  // never reads a reply
  EXPECT_FALSE(service.is_open(reader.id()));
  EXPECT_NE(reason_of(service, reader.id()).find("kTcpStoreMaxQueuedReplies"), std::string::npos);
  // The store and the other client go on.
  EXPECT_EQ(code_of(setter.call(op(TcpStoreOp::kNumKeys).take())), StatusCode::kOk);
}

TEST(TcpStoreServiceTest, TheStoresKeyAndByteLimitsAnswerResourceExhausted) {
  TcpStoreServiceOptions options{kSecret};
  options.max_keys = 2;
  options.max_table_bytes = 64;
  TcpStoreService service(options);
  ServiceClient client(service);
  ASSERT_EQ(client.handshake(kSecret), StatusCode::kOk);
  EXPECT_EQ(code_of(client.call(op(TcpStoreOp::kSet).str("a").str("1").take())), StatusCode::kOk);
  EXPECT_EQ(code_of(client.call(op(TcpStoreOp::kSet).str("b").str("2").take())), StatusCode::kOk);
  const std::string third = client.call(op(TcpStoreOp::kSet).str("c").str("3").take());
  EXPECT_EQ(code_of(third), StatusCode::kResourceExhausted);
  EXPECT_NE(third.find("kTcpStoreMaxKeys"), std::string::npos);
  // Replacing an existing key is fine; growing past the byte limit is not.
  EXPECT_EQ(code_of(client.call(op(TcpStoreOp::kSet).str("a").str("11").take())), StatusCode::kOk);
  const std::string big = client.call(op(TcpStoreOp::kSet).str("a").str(std::string(100, 'x')).take());
  EXPECT_EQ(code_of(big), StatusCode::kResourceExhausted);
  EXPECT_NE(big.find("kTcpStoreMaxTableBytes"), std::string::npos);
  EXPECT_EQ(code_of(client.call(op(TcpStoreOp::kAdd).str("n").i64(1).take())), StatusCode::kResourceExhausted);
  EXPECT_TRUE(service.is_open(client.id()));
}

TEST(TcpStoreServiceTest, AForgedKeyCountIsMalformedNotAllocated) {
  TcpStoreService service(TcpStoreServiceOptions{});
  ServiceClient client(service);
  ASSERT_EQ(client.handshake(""), StatusCode::kOk);
  const std::string reply = client.call(op(TcpStoreOp::kCheck).u32(0xffffffffu).take());
  EXPECT_EQ(code_of(reply), StatusCode::kInvalidArgument);
  EXPECT_TRUE(service.is_open(client.id()));
}

TEST(TcpStoreServiceTest, IdleHandshakesAreShedOldestFirstAndTimeOut) {
  TcpStoreServiceOptions options{kSecret};
  options.max_pending_handshakes = 4;
  TcpStoreService service(options);
  const Clock::time_point start = Clock::time_point() + std::chrono::hours(1);
  std::vector<TcpStoreService::ConnectionId> idle;
  for (int i = 0; i < 10; ++i) idle.push_back(service.open(start));
  EXPECT_EQ(service.pending_handshakes(), 4u);
  EXPECT_FALSE(service.is_open(idle.front()));
  EXPECT_TRUE(service.is_open(idle.back()));
  EXPECT_EQ(service.take_dropped().size(), 6u);

  // A client that completes its handshake is no longer pending: idle newcomers cannot shed it.
  ServiceClient good(service);
  good.now_ = start;
  ASSERT_EQ(good.handshake(kSecret), StatusCode::kOk);
  for (int i = 0; i < 10; ++i) service.open(start);
  EXPECT_TRUE(service.is_open(good.id()));

  EXPECT_EQ(service.next_deadline(start + std::chrono::hours(1)), start + kTcpStoreHandshakeTimeout);
  service.on_tick(start + kTcpStoreHandshakeTimeout);
  EXPECT_EQ(service.pending_handshakes(), 0u);
  EXPECT_EQ(service.connection_count(), 1u);
  EXPECT_TRUE(service.is_open(good.id()));
}

TEST(TcpStoreAuthTest, TheAnswerDependsOnSecretAndNonce) {
  const std::string nonce = tcp_store_auth_nonce();
  EXPECT_EQ(nonce.size(), kTcpStoreNonceBytes);
  EXPECT_NE(nonce, tcp_store_auth_nonce());
  const std::string answer = tcp_store_auth_response(kSecret, nonce);
  EXPECT_EQ(answer.size(), 32u);
  EXPECT_TRUE(tcp_store_auth_verify(kSecret, nonce, answer));
  EXPECT_FALSE(tcp_store_auth_verify("other", nonce, answer));
  EXPECT_FALSE(tcp_store_auth_verify(kSecret, tcp_store_auth_nonce(), answer));
  EXPECT_FALSE(tcp_store_auth_verify(kSecret, nonce, answer.substr(1)));
  EXPECT_FALSE(tcp_store_auth_verify(kSecret, nonce, ""));
}

}  // namespace
}  // namespace cohort::comm
