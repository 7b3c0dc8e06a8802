// Fuzzes what the tcp store server does with the bytes its clients send: TcpStoreService, the
// socket-free core of TcpStoreServer (handshake, framing, store ops, parked waiters, limits), driven
// the way the server's poll loop drives it. Going through the service rather than real sockets
// keeps each input deterministic (a fake clock) and fast (no threads, no ports).
//
// Input: one flags byte, then records until the input ends.
//   flags  bit 0: the service has a secret (clients must answer the challenge: the unauthenticated
//                 path, which is what an attacker without the job secret reaches)
//          bit 1: small limits (buffers, queued replies, keys, table bytes), so every limit's path
//                 is reachable with short inputs
//          bits 2-3: connections opened at the start, minus one
//   record: u8 op (bits 0-1: connection slot, bits 2-4: action), u8 n, then for action 0 n bytes
//     action 0: n bytes arrive on the slot's connection (on_bytes)
//     action 1: the clock advances n * 10 ms, then on_tick (waiter and handshake timeouts)
//     action 2: the client reads n bytes of its replies (0: all of them)
//     action 3: the client closes the connection; the slot gets a new one
//     other:    the slot gets a new connection without closing the old one (more connections)
// Invariants: after every record, dropped connections are gone, the store keeps within its key and
// byte limits, and the buffered-byte count has not wrapped below zero; at the end, with every
// connection closed, the service holds no connection and counts no buffered byte (its accounting
// balances).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "worker/comm/store/tcp_store_service.h"

namespace {

using cohort::comm::Clock;
using cohort::comm::TcpStoreService;
using cohort::comm::TcpStoreServiceOptions;

constexpr size_t kSlots = 4;

void check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "tcp_store_server_fuzzer: invariant broken: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  TcpStoreServiceOptions options;
  if (flags & 1) options.secret = "fuzz-job-secret";
  if (flags & 2) {
    options.max_buffered_bytes_per_connection = 512;
    options.max_queued_replies = 3;
    options.max_queued_reply_bytes = 256;
    options.max_buffered_bytes_total = 2048;
    options.max_keys = 8;
    options.max_table_bytes = 1024;
    options.max_keys_per_request = 4;
    options.max_pending_handshakes = 2;
  }
  TcpStoreService service(options);
  Clock::time_point now{};  // a fake clock: inputs replay exactly
  TcpStoreService::ConnectionId slots[kSlots] = {};
  const size_t initial = 1 + ((flags >> 2) & 3);
  std::vector<TcpStoreService::ConnectionId> opened;  // every id, to close them all at the end
  auto open = [&] {
    opened.push_back(service.open(now));
    return opened.back();
  };
  for (size_t i = 0; i < initial; ++i) slots[i] = open();

  size_t position = 1;
  while (position + 2 <= size) {
    const uint8_t op = data[position];
    const size_t n = data[position + 1];
    position += 2;
    const size_t slot = op & 3;
    TcpStoreService::ConnectionId& id = slots[slot];
    switch ((op >> 2) & 7) {
      case 0: {
        const size_t length = std::min(n, size - position);
        service.on_bytes(id, std::string_view(reinterpret_cast<const char*>(data + position), length), now);
        position += length;
        break;
      }
      case 1:
        now += std::chrono::milliseconds(10 * n);
        service.on_tick(now);
        break;
      case 2: {
        const size_t pending = service.output(id).size();
        service.consume_output(id, n == 0 ? pending : std::min(n, pending));
        break;
      }
      case 3:
        service.close(id);
        id = open();
        break;
      default:
        id = open();
        break;
    }
    for (const TcpStoreService::Dropped& dropped : service.take_dropped()) {
      check(!dropped.reason.ok(), "a dropped connection has an OK reason");
      check(!service.is_open(dropped.id), "a dropped connection is still open");
    }
    // Inputs are at most a few MB, so anything near SIZE_MAX is an underflow of the accounting.
    check(service.buffered_bytes() < (size_t{1} << 40), "the buffered-byte count wrapped below zero");
    check(service.table().size() <= options.max_keys, "more keys than max_keys");
    check(service.table().bytes() <= options.max_table_bytes, "more table bytes than max_table_bytes");
    (void)service.next_deadline(now + std::chrono::seconds(1));
  }
  for (TcpStoreService::ConnectionId id : opened) service.close(id);
  (void)service.take_dropped();
  check(service.connection_count() == 0, "connections left after every one was closed");
  check(service.pending_handshakes() == 0, "handshakes left after every connection was closed");
  check(service.buffered_bytes() == 0, "buffered bytes counted after every connection was closed");
  return 0;
}
