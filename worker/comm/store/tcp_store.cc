#include "worker/comm/store/tcp_store.h"

#include <algorithm>
#include <thread>

#include "worker/comm/store/store_wait.h"
#include "worker/comm/store/tcp_socket.h"
#include "worker/comm/store/tcp_store_auth.h"
#include "worker/comm/store/tcp_store_protocol.h"
#include "worker/comm/store/wire_format.h"

namespace cohort::comm {
namespace {

// Largest valid TCP port.
constexpr int kMaxPort = 65535;

// A request body begun with its op; the caller appends the arguments.
WireWriter request(TcpStoreOp op) {
  WireWriter writer;
  writer.u8(static_cast<uint8_t>(op));
  return writer;
}

}  // namespace

TcpStore::TcpStore(std::string host, int port, Duration timeout, std::string secret,
                   std::unique_ptr<TcpStoreServer> server)
    : host_(std::move(host)),
      port_(port),
      timeout_(clamp_store_timeout(timeout)),
      name_("tcp store " + format_host_port(host_, port_)),
      secret_(std::move(secret)),
      server_(std::move(server)) {}

TcpStore::~TcpStore() = default;

StatusOr<std::unique_ptr<TcpStore>> TcpStore::connect(const std::string& host, int port, Duration timeout,
                                                      std::string secret) {
  if (port <= 0 || port > kMaxPort) {
    return invalid_argument_error("tcp store {}: port {} is not in 1..{}; pass the server's port",
                                  format_host_port(host, port), port, kMaxPort);
  }
  std::unique_ptr<TcpStore> store(new TcpStore(host, port, timeout, std::move(secret), nullptr));
  COHORT_RETURN_IF_ERROR(store->await_server());
  return store;
}

StatusOr<std::unique_ptr<TcpStore>> TcpStore::create(const std::string& host, int port, bool is_server,
                                                     Duration timeout, std::string secret) {
  if (!is_server) return connect(host, port, timeout, std::move(secret));
  TcpStoreServerOptions options;
  options.host = host;
  options.port = port;
  options.service.secret = secret;
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<TcpStoreServer> server, TcpStoreServer::start(options));
  const int bound = server->port();
  std::unique_ptr<TcpStore> store(new TcpStore(host, bound, timeout, std::move(secret), std::move(server)));
  COHORT_RETURN_IF_ERROR(store->await_server());
  return store;
}

Status TcpStore::await_server() {
  const Deadline deadline = Deadline::after(timeout_);
  StatusOr<ScopedFd> fd = open_connection(deadline, /*retry_refused=*/true);
  if (!fd.ok() && fd.status().code() != StatusCode::kUnauthenticated &&
      fd.status().code() != StatusCode::kFailedPrecondition) {
    return deadline_exceeded_error(
        "{}: no server answered within {} (last error: {}); check that the serving rank (rank 0) is "
        "running and that the host and port (MASTER_ADDR / MASTER_PORT) point at it",
        name_, format_duration(timeout_), fd.status().message());
  }
  COHORT_RETURN_IF_ERROR(fd.status());
  return_connection(std::move(fd).value());
  return ok_status();
}

StatusOr<ScopedFd> TcpStore::open_connection(const Deadline& deadline, bool retry_refused) {
  Duration pause = kTcpStoreMinConnectRetryInterval;
  while (true) {
    StatusOr<ScopedFd> fd = connect_tcp(host_, port_, deadline);
    if (!fd.ok() && !retry_refused) return fd.status();
    Status result = fd.status();
    if (fd.ok()) {
      result = handshake(fd->get(), deadline);
      if (result.ok()) return fd;
      // Refused credentials or versions do not get better by retrying.
      if (result.code() != StatusCode::kUnavailable) return result;
    }
    if (deadline.expired()) return result;
    // Refused, unresolvable, or closed mid-handshake: the server (or its DNS name) may not exist
    // yet, or it shed this connection under a flood of others.
    std::this_thread::sleep_for(std::min(pause, deadline.remaining()));
    pause = std::min(pause * 2, kTcpStoreMaxConnectRetryInterval);
  }
}

Status TcpStore::handshake(int fd, const Deadline& deadline) {
  const Call hello{"hello", request(TcpStoreOp::kHello).u32(kTcpStoreMagic).u32(kTcpStoreProtocolVersion).take(),
                   timeout_};
  std::string reply;
  COHORT_RETURN_IF_ERROR(exchange(fd, hello, deadline, &reply).with_context("hello"));
  COHORT_RETURN_IF_ERROR(reply_status(hello, reply));
  WireReader result(std::string_view(reply).substr(1));
  uint8_t auth_required = 0;
  std::string nonce;
  if (!result.u8(&auth_required) || !result.str(&nonce)) {
    return failed_precondition_error("{}: malformed reply to hello; do all ranks run the same cohort version?",
                                     name_);
  }
  if (auth_required == 0) return ok_status();
  if (secret_.empty()) {
    return unauthenticated_error(
        "{}: the server requires the job's secret and this process has none; set {} to the job's secret "
        "(the cohort agent sets it for its ranks)",
        name_, kJobSecretEnvironmentVariable);
  }
  const Call auth{"auth", request(TcpStoreOp::kAuth).str(tcp_store_auth_response(secret_, nonce)).take(),
                  timeout_};
  COHORT_RETURN_IF_ERROR(exchange(fd, auth, deadline, &reply).with_context("auth"));
  return reply_status(auth, reply);
}

StatusOr<ScopedFd> TcpStore::take_connection(const Deadline& deadline) {
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!idle_.empty()) {
      ScopedFd fd = std::move(idle_.back());
      idle_.pop_back();
      return fd;
    }
  }
  // No retry of a refused connect: the server was up at connect(), so a refusal now means it is gone.
  return open_connection(deadline, /*retry_refused=*/false);
}

void TcpStore::return_connection(ScopedFd fd) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  idle_.push_back(std::move(fd));
}

StatusOr<std::string> TcpStore::call(const Call& call) {
  const Deadline deadline = Deadline::after(call.reply_timeout);
  std::string reply;
  Status exchanged = [&]() -> Status {
    COHORT_ASSIGN_OR_RETURN(ScopedFd fd, take_connection(deadline));
    COHORT_RETURN_IF_ERROR(exchange(fd.get(), call, deadline, &reply));
    // Only a connection whose exchange completed is in a known state; others close here.
    return_connection(std::move(fd));
    return ok_status();
  }();
  if (!exchanged.ok()) {
    const std::string hint =
        exchanged.code() == StatusCode::kDeadlineExceeded
            ? "is the process serving the store (rank 0) stopped or overloaded?"
            : "the process serving the store (rank 0) has probably exited, or the network failed";
    return Status(exchanged.code(),
                  fmt::format("{}: {} failed: {}; {}", name_, call.what, exchanged.message(), hint));
  }
  COHORT_RETURN_IF_ERROR(reply_status(call, reply));
  return reply.substr(1);
}

Status TcpStore::exchange(int fd, const Call& call, const Deadline& deadline, std::string* reply) {
  COHORT_RETURN_IF_ERROR(send_all(fd, tcp_store_frame(call.request), deadline));
  std::string header;
  COHORT_RETURN_IF_ERROR(recv_exact(fd, kTcpStoreFrameHeaderBytes, deadline, &header));
  COHORT_ASSIGN_OR_RETURN(uint32_t length, tcp_store_frame_length(header));
  COHORT_RETURN_IF_ERROR(recv_exact(fd, length, deadline, reply));
  if (reply->empty()) return internal_error("empty reply");
  return ok_status();
}

Status TcpStore::reply_status(const Call& call, std::string_view reply) const {
  const auto code = static_cast<StatusCode>(static_cast<uint8_t>(reply[0]));
  if (code == StatusCode::kOk) return ok_status();
  WireReader fields(reply.substr(1));
  std::string message;
  std::vector<std::string> missing;
  if (!fields.str(&message) || !fields.strs(&missing)) {
    return internal_error("{}: malformed error reply to {}; do all ranks run the same cohort version?", name_,
                          call.what);
  }
  if (code == StatusCode::kDeadlineExceeded && call.keys != nullptr) {
    return keys_timeout_error(name_, missing, call.keys->size(), call.wait_timeout);
  }
  return Status(code, fmt::format("{}: {}", name_, message));
}

namespace {

Status malformed_reply(std::string_view store, std::string_view what) {
  return internal_error("{}: malformed reply to {}; do all ranks run the same cohort version?", store, what);
}

}  // namespace

Status TcpStore::set(std::string_view key, std::string_view value) {
  Call call{fmt::format("set({:?})", key), request(TcpStoreOp::kSet).str(key).str(value).take(), timeout_};
  return this->call(call).status();
}

StatusOr<std::string> TcpStore::get(std::string_view key, Duration timeout) {
  const std::vector<std::string> keys{std::string(key)};
  Call call{fmt::format("get({:?})", key),
            request(TcpStoreOp::kGet).str(key).i64(clamp_store_timeout(timeout).count()).take(),
            clamp_store_timeout(timeout) + kTcpStoreReplyGrace, &keys, timeout};
  COHORT_ASSIGN_OR_RETURN(std::string result, this->call(call));
  std::string value;
  if (!WireReader(result).str(&value)) return malformed_reply(name_, call.what);
  return value;
}

StatusOr<int64_t> TcpStore::add(std::string_view key, int64_t delta) {
  Call call{fmt::format("add({:?}, {})", key, delta), request(TcpStoreOp::kAdd).str(key).i64(delta).take(),
            timeout_};
  COHORT_ASSIGN_OR_RETURN(std::string result, this->call(call));
  int64_t sum = 0;
  if (!WireReader(result).i64(&sum)) return malformed_reply(name_, call.what);
  return sum;
}

StatusOr<std::string> TcpStore::compare_set(std::string_view key, std::string_view expected,
                                            std::string_view desired) {
  Call call{fmt::format("compare_set({:?})", key),
            request(TcpStoreOp::kCompareSet).str(key).str(expected).str(desired).take(), timeout_};
  COHORT_ASSIGN_OR_RETURN(std::string result, this->call(call));
  std::string value;
  if (!WireReader(result).str(&value)) return malformed_reply(name_, call.what);
  return value;
}

Status TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  Call call{fmt::format("wait({})", format_keys(keys)),
            request(TcpStoreOp::kWait).strs(keys).i64(clamp_store_timeout(timeout).count()).take(),
            clamp_store_timeout(timeout) + kTcpStoreReplyGrace, &keys, timeout};
  return this->call(call).status();
}

StatusOr<bool> TcpStore::check(const std::vector<std::string>& keys) {
  Call call{fmt::format("check({})", format_keys(keys)), request(TcpStoreOp::kCheck).strs(keys).take(),
            timeout_};
  COHORT_ASSIGN_OR_RETURN(std::string result, this->call(call));
  uint8_t present = 0;
  if (!WireReader(result).u8(&present)) return malformed_reply(name_, call.what);
  return present != 0;
}

StatusOr<bool> TcpStore::delete_key(std::string_view key) {
  Call call{fmt::format("delete_key({:?})", key), request(TcpStoreOp::kDelete).str(key).take(), timeout_};
  COHORT_ASSIGN_OR_RETURN(std::string result, this->call(call));
  uint8_t existed = 0;
  if (!WireReader(result).u8(&existed)) return malformed_reply(name_, call.what);
  return existed != 0;
}

StatusOr<int64_t> TcpStore::num_keys() {
  Call call{"num_keys()", request(TcpStoreOp::kNumKeys).take(), timeout_};
  COHORT_ASSIGN_OR_RETURN(std::string result, this->call(call));
  int64_t count = 0;
  if (!WireReader(result).i64(&count)) return malformed_reply(name_, call.what);
  return count;
}

}  // namespace cohort::comm
