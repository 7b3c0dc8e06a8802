#pragma once

// The tcp store's wire protocol, shared by TcpStore (client) and TcpStoreServer.
//
// Every message is a frame: a u32 little-endian body length, then the body (wire_format.h).
//   request body:  u8 TcpStoreOp, then the op's arguments
//   reply body:    u8 StatusCode; if OK the op's result, else str message + strs missing_keys
// A connection carries one request at a time: the client sends a request and reads its reply
// before the next (the client keeps a pool of connections for concurrent calls).
//
// Every connection starts with a handshake; the server answers nothing else until it completes:
//   1. client: kHello. server: u8 auth_required, str nonce (kTcpStoreNonceBytes random bytes, or
//      empty when the server has no secret).
//   2. when auth_required, client: kAuth with tcp_store_auth_response(secret, nonce) (an
//      HMAC-SHA256, tcp_store_auth.h). A wrong or missing answer gets UNAUTHENTICATED, then the
//      server closes the connection.
//
//   op            arguments                        result
//   kHello        u32 magic, u32 version           u8 auth_required, str nonce
//   kAuth         str response                     -
//   kSet          str key, str value               -
//   kGet          str key, i64 timeout_ms          str value        (waits server-side)
//   kAdd          str key, i64 delta               i64 sum
//   kCompareSet   str key, str expected, str want  str value after
//   kWait         strs keys, i64 timeout_ms        -                (waits server-side)
//   kCheck        strs keys                        u8 all present
//   kDelete       str key                          u8 existed
//   kNumKeys      -                                i64 count
// A get/wait that times out replies DEADLINE_EXCEEDED with the keys still missing, so the client
// words the error with its own name for the store.

#include <cstdint>
#include <string>
#include <string_view>

#include "worker/base/status.h"

namespace cohort::comm {

enum class TcpStoreOp : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kAdd = 4,
  kCompareSet = 5,
  kWait = 6,
  kCheck = 7,
  kDelete = 8,
  kNumKeys = 9,
  kAuth = 10,
};

// "COKV": the first bytes of a hello, so a client that reached some other service fails clearly.
inline constexpr uint32_t kTcpStoreMagic = 0x564b4f43;
// Bumped on any incompatible change to the table above.
inline constexpr uint32_t kTcpStoreProtocolVersion = 2;  // 2: the hello/auth handshake
// Bytes in a frame's length prefix.
inline constexpr size_t kTcpStoreFrameHeaderBytes = 4;
// Largest frame either side accepts: store values are addresses and ids, not tensors; a larger
// length means a peer speaking another protocol (or an attack). The server refuses a larger
// length prefix from its header alone, before buffering any of the body.
inline constexpr uint32_t kTcpStoreMaxFrameBytes = 16u << 20;
// Largest frame the server accepts before a connection has completed its handshake: a hello or
// an auth answer is a few dozen bytes.
inline constexpr uint32_t kTcpStoreMaxHandshakeFrameBytes = 256;
// Random bytes in the server's challenge.
inline constexpr size_t kTcpStoreNonceBytes = 32;

// `body` with its length prefix.
std::string tcp_store_frame(std::string_view body);

// The body length in a frame header (the first kTcpStoreFrameHeaderBytes of `header`).
// INVALID_ARGUMENT when over `max_bytes`.
StatusOr<uint32_t> tcp_store_frame_length(std::string_view header,
                                          uint32_t max_bytes = kTcpStoreMaxFrameBytes);

}  // namespace cohort::comm
