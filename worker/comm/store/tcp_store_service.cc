#include "worker/comm/store/tcp_store_service.h"

#include <algorithm>

#include "worker/comm/store/store_wait.h"
#include "worker/comm/store/tcp_store_auth.h"

namespace cohort::comm {
namespace {

// The bytes a decimal int64 can take, for add()'s room check.
constexpr size_t kMaxInt64DecimalBytes = 20;

}  // namespace

struct TcpStoreService::Connection {
  enum class Stage { kAwaitHello, kAwaitAuth, kReady };

  ConnectionId id = 0;
  Stage stage = Stage::kAwaitHello;
  std::string nonce;              // the challenge sent in kAwaitAuth
  std::string in;                 // received bytes; those before in_pos are handled
  size_t in_pos = 0;
  std::deque<std::string> out;    // reply frames not yet sent
  size_t out_pos = 0;             // bytes of out.front() already sent
  size_t out_bytes = 0;           // unsent bytes in `out`
  bool parked = false;            // a get/wait of this connection is a waiter; later input waits
  bool dropped = false;           // erased at the end of the public call
};

TcpStoreService::TcpStoreService(TcpStoreServiceOptions options) : options_(std::move(options)) {}

TcpStoreService::~TcpStoreService() = default;

TcpStoreService::Connection* TcpStoreService::find(ConnectionId id) const {
  auto it = connections_.find(id);
  return it == connections_.end() || it->second->dropped ? nullptr : it->second.get();
}

bool TcpStoreService::is_open(ConnectionId id) const { return find(id) != nullptr; }

bool TcpStoreService::is_authenticated(ConnectionId id) const {
  const Connection* connection = find(id);
  return connection != nullptr && connection->stage == Connection::Stage::kReady;
}

TcpStoreService::ConnectionId TcpStoreService::open(Clock::time_point now) {
  if (handshakes_.size() >= options_.max_pending_handshakes && !handshakes_.empty()) {
    if (Connection* oldest = find(handshakes_.begin()->first)) {
      drop(*oldest, resource_exhausted_error(
                        "dropped before its handshake completed: {} connections are in their handshake "
                        "(kTcpStoreMaxPendingHandshakes) and a newer one arrived",
                        options_.max_pending_handshakes));
    }
    sweep();
  }
  auto connection = std::make_unique<Connection>();
  connection->id = next_id_++;
  const ConnectionId id = connection->id;
  connections_[id] = std::move(connection);
  handshakes_[id] = now;
  return id;
}

void TcpStoreService::on_bytes(ConnectionId id, std::string_view bytes, Clock::time_point now) {
  Connection* connection = find(id);
  if (connection == nullptr) return;
  connection->in.append(bytes);
  buffered_bytes_ += bytes.size();
  handle_requests(*connection, now);
  if (!connection->dropped && connection->in.size() - connection->in_pos > options_.max_buffered_bytes_per_connection) {
    drop(*connection, resource_exhausted_error(
                          "the client sent {} bytes ahead of its replies, over the {} byte limit "
                          "(kTcpStoreMaxBufferedBytesPerConnection); a cohort client sends one request at a time",
                          connection->in.size() - connection->in_pos, options_.max_buffered_bytes_per_connection));
  }
  if (!connection->dropped && buffered_bytes_ > options_.max_buffered_bytes_total) {
    drop(*connection, resource_exhausted_error(
                          "the store server holds {} buffered bytes, over the {} byte limit "
                          "(kTcpStoreMaxBufferedBytesTotal); dropping the connection that passed it",
                          buffered_bytes_, options_.max_buffered_bytes_total));
  }
  resume_parked_connections(now);
  sweep();
}

void TcpStoreService::on_tick(Clock::time_point now) {
  complete_waiters(now);
  for (auto it = handshakes_.begin(); it != handshakes_.end() && it->second + options_.handshake_timeout <= now;) {
    Connection* connection = find(it->first);
    ++it;  // drop() erases the entry
    if (connection != nullptr) {
      drop(*connection, deadline_exceeded_error("no handshake within {} (kTcpStoreHandshakeTimeout)",
                                                format_duration(options_.handshake_timeout)));
    }
  }
  resume_parked_connections(now);
  sweep();
}

Clock::time_point TcpStoreService::next_deadline(Clock::time_point idle) const {
  Clock::time_point next = idle;
  for (const Waiter& waiter : waiters_) next = std::min(next, waiter.deadline);
  if (!handshakes_.empty()) next = std::min(next, handshakes_.begin()->second + options_.handshake_timeout);
  return next;
}

std::string_view TcpStoreService::output(ConnectionId id) const {
  const Connection* connection = find(id);
  if (connection == nullptr || connection->out.empty()) return {};
  return std::string_view(connection->out.front()).substr(connection->out_pos);
}

void TcpStoreService::consume_output(ConnectionId id, size_t n) {
  Connection* connection = find(id);
  if (connection == nullptr) return;
  while (n > 0 && !connection->out.empty()) {
    const size_t left = connection->out.front().size() - connection->out_pos;
    const size_t taken = std::min(n, left);
    connection->out_pos += taken;
    connection->out_bytes -= taken;
    buffered_bytes_ -= taken;
    n -= taken;
    if (connection->out_pos == connection->out.front().size()) {
      connection->out.pop_front();
      connection->out_pos = 0;
    }
  }
}

void TcpStoreService::close(ConnectionId id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  forget(*it->second);
  connections_.erase(it);
}

std::vector<TcpStoreService::Dropped> TcpStoreService::take_dropped() {
  std::vector<Dropped> out;
  out.swap(dropped_);
  return out;
}

void TcpStoreService::handle_requests(Connection& connection, Clock::time_point now) {
  while (!connection.dropped && !connection.parked &&
         connection.in.size() - connection.in_pos >= kTcpStoreFrameHeaderBytes) {
    const std::string_view pending = std::string_view(connection.in).substr(connection.in_pos);
    const uint32_t limit = connection.stage == Connection::Stage::kReady ? kTcpStoreMaxFrameBytes
                                                                         : kTcpStoreMaxHandshakeFrameBytes;
    // Checked from the header alone: a huge length prefix is refused before any body is buffered.
    StatusOr<uint32_t> length = tcp_store_frame_length(pending, limit);
    if (!length.ok()) return drop(connection, length.status());
    if (pending.size() < kTcpStoreFrameHeaderBytes + *length) break;
    const std::string body(pending.substr(kTcpStoreFrameHeaderBytes, *length));
    connection.in_pos += kTcpStoreFrameHeaderBytes + *length;
    handle_request(connection, body, now);
  }
  if (connection.dropped) return;
  // Compact once per batch, not per frame: a pipelining client must not make handling quadratic.
  buffered_bytes_ -= connection.in_pos;
  connection.in.erase(0, connection.in_pos);
  connection.in_pos = 0;
}

void TcpStoreService::handle_handshake(Connection& connection, TcpStoreOp op, WireReader& args) {
  if (connection.stage == Connection::Stage::kAwaitHello) {
    uint32_t magic = 0, version = 0;
    if (op != TcpStoreOp::kHello || !args.u32(&magic) || !args.u32(&version)) {
      reply_error(connection, unauthenticated_error("the first request on a connection must be hello"));
      return drop(connection, unauthenticated_error("op {} before hello", static_cast<int>(op)));
    }
    if (magic != kTcpStoreMagic || version != kTcpStoreProtocolVersion) {
      const Status status = failed_precondition_error(
          "client speaks protocol {:#x}/v{}, this server {:#x}/v{}; run the same cohort version on every rank",
          magic, version, kTcpStoreMagic, kTcpStoreProtocolVersion);
      reply_error(connection, status);
      return drop(connection, status);
    }
    if (options_.secret.empty()) {
      connection.stage = Connection::Stage::kReady;
      handshakes_.erase(connection.id);
      return reply_ok(connection, WireWriter().u8(0).str(""));
    }
    connection.nonce = tcp_store_auth_nonce();
    connection.stage = Connection::Stage::kAwaitAuth;
    return reply_ok(connection, WireWriter().u8(1).str(connection.nonce));
  }
  std::string response;
  if (op != TcpStoreOp::kAuth || !args.str(&response) ||
      !tcp_store_auth_verify(options_.secret, connection.nonce, response)) {
    const Status status = unauthenticated_error(
        "wrong answer to the store's challenge: the client does not hold this job's secret; every rank "
        "must get the same {} (the cohort agent sets it)",
        kJobSecretEnvironmentVariable);
    reply_error(connection, status);
    return drop(connection, status);
  }
  connection.stage = Connection::Stage::kReady;
  connection.nonce.clear();
  handshakes_.erase(connection.id);
  reply_ok(connection, WireWriter());
}

void TcpStoreService::handle_request(Connection& connection, std::string_view body, Clock::time_point now) {
  WireReader args(body);
  uint8_t op = 0;
  args.u8(&op);
  if (connection.stage != Connection::Stage::kReady) {
    return handle_handshake(connection, static_cast<TcpStoreOp>(op), args);
  }
  std::string key, value, expected;
  std::vector<std::string> keys;
  int64_t number = 0;
  switch (static_cast<TcpStoreOp>(op)) {
    case TcpStoreOp::kHello:
    case TcpStoreOp::kAuth:
      return reply_error(connection, failed_precondition_error("the handshake is already complete"));
    case TcpStoreOp::kSet: {
      if (!args.str(&key) || !args.str(&value)) break;
      if (Status room = check_room(key, value.size()); !room.ok()) return reply_error(connection, room);
      table_.set(key, value);
      reply_ok(connection, WireWriter());
      return complete_waiters(now);
    }
    case TcpStoreOp::kGet:
      if (!args.str(&key) || !args.i64(&number)) break;
      return start_wait(connection, TcpStoreOp::kGet, {key}, number, now);
    case TcpStoreOp::kAdd: {
      if (!args.str(&key) || !args.i64(&number)) break;
      if (Status room = check_room(key, kMaxInt64DecimalBytes); !room.ok()) return reply_error(connection, room);
      StatusOr<int64_t> sum = table_.add(key, number);
      if (!sum.ok()) return reply_error(connection, sum.status());
      reply_ok(connection, WireWriter().i64(*sum));
      return complete_waiters(now);
    }
    case TcpStoreOp::kCompareSet: {
      if (!args.str(&key) || !args.str(&expected) || !args.str(&value)) break;
      if (Status room = check_room(key, value.size()); !room.ok()) return reply_error(connection, room);
      reply_ok(connection, WireWriter().str(table_.compare_set(key, expected, value)));
      return complete_waiters(now);
    }
    case TcpStoreOp::kWait:
      if (!args.strs(&keys, options_.max_keys_per_request) || !args.i64(&number)) break;
      return start_wait(connection, TcpStoreOp::kWait, std::move(keys), number, now);
    case TcpStoreOp::kCheck:
      if (!args.strs(&keys, options_.max_keys_per_request)) break;
      return reply_ok(connection, WireWriter().u8(table_.contains_all(keys) ? 1 : 0));
    case TcpStoreOp::kDelete:
      if (!args.str(&key)) break;
      return reply_ok(connection, WireWriter().u8(table_.erase(key) ? 1 : 0));
    case TcpStoreOp::kNumKeys:
      return reply_ok(connection, WireWriter().i64(table_.size()));
  }
  // Frames are length-delimited, so a malformed body spoils only itself: answer and carry on.
  reply_error(connection, invalid_argument_error(
                              "malformed request: op {} with {} bytes (a wait or check takes at most {} keys, "
                              "kTcpStoreMaxKeysPerRequest)",
                              op, body.size(), options_.max_keys_per_request));
}

Status TcpStoreService::check_room(std::string_view key, size_t value_bytes) const {
  const std::string* current = table_.find(key);
  if (current == nullptr && table_.size() >= options_.max_keys) {
    return resource_exhausted_error(
        "the store holds {} keys, its limit (kTcpStoreMaxKeys); delete keys that are no longer needed",
        table_.size());
  }
  const size_t old_bytes = current == nullptr ? 0 : key.size() + current->size();
  const size_t after = table_.bytes() - old_bytes + key.size() + value_bytes;
  if (after > options_.max_table_bytes) {
    return resource_exhausted_error(
        "storing {} bytes at this key would bring the store to {} bytes, over its {} byte limit "
        "(kTcpStoreMaxTableBytes); the store is for addresses and ids, keep bulk data elsewhere",
        value_bytes, after, options_.max_table_bytes);
  }
  return ok_status();
}

void TcpStoreService::start_wait(Connection& connection, TcpStoreOp op, std::vector<std::string> keys,
                                 int64_t timeout_ms, Clock::time_point now) {
  Waiter waiter{connection.id, op, std::move(keys),
                now + clamp_store_timeout(Duration(std::max<int64_t>(timeout_ms, 0)))};
  if (table_.contains_all(waiter.keys)) return reply_waiter(connection, waiter, /*timed_out=*/false);
  if (timeout_ms <= 0) return reply_waiter(connection, waiter, /*timed_out=*/true);
  connection.parked = true;
  waiters_.push_back(std::move(waiter));
}

void TcpStoreService::complete_waiters(Clock::time_point now) {
  for (size_t i = 0; i < waiters_.size();) {
    const bool present = table_.contains_all(waiters_[i].keys);
    if (!present && now < waiters_[i].deadline) {
      ++i;
      continue;
    }
    const Waiter waiter = std::move(waiters_[i]);
    waiters_.erase(waiters_.begin() + static_cast<std::ptrdiff_t>(i));
    Connection* connection = find(waiter.id);
    if (connection == nullptr) continue;
    reply_waiter(*connection, waiter, /*timed_out=*/!present);
    resumable_.push_back(waiter.id);
  }
}

void TcpStoreService::reply_waiter(Connection& connection, const Waiter& waiter, bool timed_out) {
  connection.parked = false;
  if (timed_out)
    return reply_error(connection, deadline_exceeded_error("timed out"), table_.missing(waiter.keys));
  if (waiter.op == TcpStoreOp::kGet) return reply_ok(connection, WireWriter().str(*table_.find(waiter.keys[0])));
  reply_ok(connection, WireWriter());
}

void TcpStoreService::reply_ok(Connection& connection, const WireWriter& result) {
  std::string body(1, static_cast<char>(StatusCode::kOk));
  body += result.bytes();
  queue_reply(connection, tcp_store_frame(body));
}

void TcpStoreService::reply_error(Connection& connection, const Status& status,
                                  const std::vector<std::string>& missing) {
  const std::string body =
      WireWriter().u8(static_cast<uint8_t>(status.code())).str(status.message()).strs(missing).take();
  queue_reply(connection, tcp_store_frame(body));
}

void TcpStoreService::queue_reply(Connection& connection, std::string frame) {
  if (connection.dropped) return;
  if (!connection.out.empty() && (connection.out.size() >= options_.max_queued_replies ||
                                  connection.out_bytes + frame.size() > options_.max_queued_reply_bytes)) {
    return drop(connection, resource_exhausted_error(
                                "the client does not read its replies: {} replies ({} bytes) are queued, the "
                                "limit is {} replies (kTcpStoreMaxQueuedReplies) or {} bytes "
                                "(kTcpStoreMaxQueuedReplyBytes)",
                                connection.out.size(), connection.out_bytes, options_.max_queued_replies,
                                options_.max_queued_reply_bytes));
  }
  connection.out_bytes += frame.size();
  buffered_bytes_ += frame.size();
  connection.out.push_back(std::move(frame));
}

void TcpStoreService::resume_parked_connections(Clock::time_point now) {
  // Handling one connection's queued requests may answer other waiters and add to the list.
  while (!resumable_.empty()) {
    const ConnectionId id = resumable_.back();
    resumable_.pop_back();
    if (Connection* connection = find(id)) handle_requests(*connection, now);
  }
}

void TcpStoreService::drop(Connection& connection, Status reason) {
  if (connection.dropped) return;
  Dropped dropped{connection.id, std::move(reason), {}};
  if (!connection.out.empty()) {
    dropped.final_output = connection.out.front().substr(connection.out_pos);
    for (size_t i = 1; i < connection.out.size(); ++i) dropped.final_output += connection.out[i];
  }
  dropped_.push_back(std::move(dropped));
  forget(connection);
  connection.dropped = true;
}

void TcpStoreService::forget(Connection& connection) {
  if (connection.dropped) return;
  const ConnectionId id = connection.id;
  waiters_.erase(std::remove_if(waiters_.begin(), waiters_.end(), [id](const Waiter& w) { return w.id == id; }),
                 waiters_.end());
  handshakes_.erase(id);
  buffered_bytes_ -= connection.in.size() + connection.out_bytes;
  connection.in.clear();
  connection.in_pos = 0;
  connection.out.clear();
  connection.out_bytes = 0;
}

void TcpStoreService::sweep() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    it = it->second->dropped ? connections_.erase(it) : std::next(it);
  }
}

}  // namespace cohort::comm
