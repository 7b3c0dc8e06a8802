#pragma once

// TcpStoreService: everything the tcp store server does with the bytes of its connections — the
// handshake (hello, challenge-response), framing, the store operations, parked get/wait waiters,
// and every per-connection and per-store limit — with no sockets. TcpStoreServer does the I/O
// around it: it feeds received bytes in, sends what the service queues, and closes the
// connections the service drops. A test or a fuzzer drives it directly:
//
//   TcpStoreService service(TcpStoreServiceOptions{.secret = "s3cret"});
//   const auto id = service.open(Clock::now());
//   service.on_bytes(id, bytes, Clock::now());
//   std::string_view reply = service.output(id);        // send, then consume_output(id, n)
//   for (const auto& dropped : service.take_dropped()) { /* close its socket */ }
//
// A client that breaks the protocol or a limit is dropped (never the whole store): a bad
// handshake, a frame over kTcpStoreMaxFrameBytes (refused from its length prefix alone), more
// buffered input than one frame, replies it does not read, more than its share of the buffered
// bytes. A store limit (keys, bytes) answers the call with RESOURCE_EXHAUSTED instead.
//
// Not thread-safe: one thread (the server's) owns it.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/store/key_value_table.h"
#include "worker/comm/store/tcp_store_protocol.h"
#include "worker/comm/store/wire_format.h"

namespace cohort::comm {

// Limits, each the default of a TcpStoreServiceOptions field. A legitimate client sends one
// request and reads its reply before the next, so one frame each way is all it ever needs.
//
// Received bytes a connection may have buffered: one whole request frame.
inline constexpr size_t kTcpStoreMaxBufferedBytesPerConnection = kTcpStoreFrameHeaderBytes + kTcpStoreMaxFrameBytes;
// Unsent replies a connection may have queued: a client that pipelines requests and never reads
// the replies is dropped here instead of growing the server's memory.
inline constexpr size_t kTcpStoreMaxQueuedReplies = 16;
// Unsent reply bytes a connection may have queued beyond its first reply (one reply of any
// size is always allowed).
inline constexpr size_t kTcpStoreMaxQueuedReplyBytes = 1u << 20;
// Buffered bytes (received and unsent, every connection together).
inline constexpr size_t kTcpStoreMaxBufferedBytesTotal = 256u << 20;
// Keys in the store.
inline constexpr int64_t kTcpStoreMaxKeys = 1 << 20;
// Bytes of keys and values in the store.
inline constexpr size_t kTcpStoreMaxTableBytes = 256u << 20;
// Keys in one wait or check request (a wait on every rank's key of a very large job fits).
inline constexpr uint32_t kTcpStoreMaxKeysPerRequest = 1u << 16;
// Connections still in their handshake; a new one beyond this drops the oldest, so idle
// connections cannot lock the job's own ranks out (theirs complete in one round trip).
inline constexpr size_t kTcpStoreMaxPendingHandshakes = 256;
// A connection must complete its handshake within this time after it is accepted.
inline constexpr Duration kTcpStoreHandshakeTimeout = std::chrono::seconds(10);

struct TcpStoreServiceOptions {
  std::string secret;  // the job secret clients must prove they hold; "" accepts every client
  size_t max_buffered_bytes_per_connection = kTcpStoreMaxBufferedBytesPerConnection;
  size_t max_queued_replies = kTcpStoreMaxQueuedReplies;
  size_t max_queued_reply_bytes = kTcpStoreMaxQueuedReplyBytes;
  size_t max_buffered_bytes_total = kTcpStoreMaxBufferedBytesTotal;
  int64_t max_keys = kTcpStoreMaxKeys;
  size_t max_table_bytes = kTcpStoreMaxTableBytes;
  uint32_t max_keys_per_request = kTcpStoreMaxKeysPerRequest;
  size_t max_pending_handshakes = kTcpStoreMaxPendingHandshakes;
  Duration handshake_timeout = kTcpStoreHandshakeTimeout;
};

class TcpStoreService {
 public:
  // Identifies a connection; never reused by one service.
  using ConnectionId = uint64_t;

  // A connection the service refuses to serve further: close it after sending `final_output`
  // (best effort: an error reply the client may read, e.g. UNAUTHENTICATED).
  struct Dropped {
    ConnectionId id;
    Status reason;  // names the limit or the protocol step
    std::string final_output;
  };

  explicit TcpStoreService(TcpStoreServiceOptions options);
  ~TcpStoreService();
  TcpStoreService(const TcpStoreService&) = delete;
  TcpStoreService& operator=(const TcpStoreService&) = delete;

  // A new connection, accepted at `now`. May drop the oldest connection still in its handshake
  // (see max_pending_handshakes).
  ConnectionId open(Clock::time_point now);

  // Bytes received on `id`, in order. Handles every complete request (answering into the
  // output queues of this and other connections, whose waiters a mutation completes). Unknown or
  // dropped ids are ignored.
  void on_bytes(ConnectionId id, std::string_view bytes, Clock::time_point now);

  // Answers the get/wait waiters whose timeout passed and drops connections whose handshake
  // took longer than handshake_timeout. Call at next_deadline() (or any time).
  void on_tick(Clock::time_point now);

  // When on_tick has work next (a waiter's or a handshake's deadline); `idle` when none is
  // sooner.
  Clock::time_point next_deadline(Clock::time_point idle) const;

  // The next bytes to send on `id` ("" when none); after sending n of them, consume_output.
  std::string_view output(ConnectionId id) const;
  void consume_output(ConnectionId id, size_t n);
  bool has_output(ConnectionId id) const { return !output(id).empty(); }

  // The client closed `id` (or the socket failed): forget it and its waiter.
  void close(ConnectionId id);

  // Connections dropped since the last call; their state is gone from the service.
  std::vector<Dropped> take_dropped();

  bool is_open(ConnectionId id) const;
  bool is_authenticated(ConnectionId id) const;
  size_t connection_count() const { return connections_.size(); }
  size_t pending_handshakes() const { return handshakes_.size(); }
  // Received and unsent bytes held, every connection together.
  size_t buffered_bytes() const { return buffered_bytes_; }
  const KeyValueTable& table() const { return table_; }

 private:
  struct Connection;
  struct Waiter {
    ConnectionId id;
    TcpStoreOp op;  // kGet or kWait
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };

  Connection* find(ConnectionId id) const;
  void handle_requests(Connection& connection, Clock::time_point now);
  void handle_request(Connection& connection, std::string_view body, Clock::time_point now);
  void handle_handshake(Connection& connection, TcpStoreOp op, WireReader& args);
  void start_wait(Connection& connection, TcpStoreOp op, std::vector<std::string> keys, int64_t timeout_ms,
                  Clock::time_point now);
  void complete_waiters(Clock::time_point now);
  void reply_waiter(Connection& connection, const Waiter& waiter, bool timed_out);
  void reply_ok(Connection& connection, const WireWriter& result);
  void reply_error(Connection& connection, const Status& status, const std::vector<std::string>& missing = {});
  void queue_reply(Connection& connection, std::string frame);
  // RESOURCE_EXHAUSTED when storing `value_bytes` at `key` would pass max_keys or max_table_bytes.
  Status check_room(std::string_view key, size_t value_bytes) const;
  void resume_parked_connections(Clock::time_point now);
  void drop(Connection& connection, Status reason);
  void forget(Connection& connection);
  void sweep();

  const TcpStoreServiceOptions options_;
  KeyValueTable table_;
  ConnectionId next_id_ = 1;
  std::map<ConnectionId, std::unique_ptr<Connection>> connections_;
  // Connections still in their handshake, by id (ids grow with time: the first is the oldest).
  std::map<ConnectionId, Clock::time_point> handshakes_;
  std::vector<Waiter> waiters_;
  std::vector<ConnectionId> resumable_;  // parked connections whose waiter was just answered
  std::vector<Dropped> dropped_;
  size_t buffered_bytes_ = 0;
};

}  // namespace cohort::comm
