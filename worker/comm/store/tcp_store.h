#pragma once

// TcpStore: the client of a TcpStoreServer (c10d's TCPStore): tcp://host:port and env:// init.
// In the usual "rank 0 serves" layout, rank 0 calls create(..., is_server=true), which runs the
// server inside rank 0's process, and every rank (rank 0 included) talks to it as a client:
//
//   COHORT_ASSIGN_OR_RETURN(auto store, TcpStore::create(master_addr, master_port, rank == 0, timeout));
//   COHORT_RETURN_IF_ERROR(store->set(fmt::format("addr/{}", rank), my_address));
//
// When the job has a secret (COHORT_JOB_SECRET; the cohort agent sets it), pass it: every
// connection then answers the server's challenge (tcp_store_auth.h) before any operation, and
// the server started by create() accepts only clients that do.
//
// Thread-safe: concurrent calls use separate connections from a small pool, so one thread blocked
// in get() does not hold up another's set(). Every call is bounded: get/wait by their timeout
// (the server answers DEADLINE_EXCEEDED), other calls by the store's timeout. A server that dies
// or stops turns the pending and later calls into UNAVAILABLE naming host:port — never a hang.

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/comm/store/scoped_fd.h"
#include "worker/comm/store/store.h"
#include "worker/comm/store/tcp_store_server.h"

namespace cohort::comm {

// A get/wait's reply may arrive this long after its timeout (the server answers at the timeout;
// this covers the trip back) before the client gives up on the server itself.
inline constexpr Duration kTcpStoreReplyGrace = std::chrono::seconds(2);
// connect() retries a refused connection after this pause, doubling up to the max: a server
// starting a moment later is found quickly, one starting minutes later costs few attempts.
inline constexpr Duration kTcpStoreMinConnectRetryInterval = std::chrono::milliseconds(10);
inline constexpr Duration kTcpStoreMaxConnectRetryInterval = std::chrono::milliseconds(500);

class TcpStore : public Store {
 public:
  // Connects to the server at host:port, retrying until `timeout` (the server may start later),
  // and completes the handshake, proving `secret` when the server asks. `timeout` also bounds
  // every later call that is not a get/wait. DEADLINE_EXCEEDED (with the last connection error)
  // when no server answered in time; UNAUTHENTICATED when the server refused the secret (or
  // wants one and `secret` is empty).
  static StatusOr<std::unique_ptr<TcpStore>> connect(const std::string& host, int port,
                                                     Duration timeout = kDefaultStoreTimeout,
                                                     std::string secret = {});

  // connect(), and when `is_server` first starts a TcpStoreServer on host:port (`host` only,
  // e.g. MASTER_ADDR, not every interface; port 0 picks a free port, see port()) requiring
  // `secret` ("" : none, with a warning), owned by the returned store. Destroying that store
  // stops the server, so the serving rank must outlive the others' use of the store.
  static StatusOr<std::unique_ptr<TcpStore>> create(const std::string& host, int port, bool is_server,
                                                    Duration timeout = kDefaultStoreTimeout,
                                                    std::string secret = {});

  ~TcpStore() override;

  const std::string& host() const { return host_; }
  // The server's port (the bound one when create() served port 0).
  int port() const { return port_; }
  // "tcp store 127.0.0.1:4567", as error messages name this store.
  const std::string& name() const { return name_; }

  Status set(std::string_view key, std::string_view value) override;
  StatusOr<std::string> get(std::string_view key, Duration timeout = kDefaultStoreTimeout) override;
  StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                    std::string_view desired) override;
  Status wait(const std::vector<std::string>& keys, Duration timeout = kDefaultStoreTimeout) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  StatusOr<bool> delete_key(std::string_view key) override;
  StatusOr<int64_t> num_keys() override;

 private:
  TcpStore(std::string host, int port, Duration timeout, std::string secret,
           std::unique_ptr<TcpStoreServer> server);

  // Sends `request` (a body) and returns the reply's result bytes, or the reply's error.
  // `what` ("get(\"k\")") and, for waits, `keys`/`wait_timeout` word the errors.
  struct Call {
    std::string what;
    std::string request;
    Duration reply_timeout;
    const std::vector<std::string>* keys = nullptr;  // a get/wait's keys, for its timeout error
    Duration wait_timeout{0};
  };
  StatusOr<std::string> call(const Call& call);
  Status exchange(int fd, const Call& call, const Deadline& deadline, std::string* reply);
  Status reply_status(const Call& call, std::string_view reply) const;
  // Opens the first pooled connection, retrying refused connections until timeout_.
  Status await_server();
  // One connection with its handshake done. `retry_refused`: keep trying a refused connect
  // (the server may start later). A connection the server closes during the handshake (it
  // sheds the oldest handshakes under a flood of connections) is retried until `deadline`.
  StatusOr<ScopedFd> open_connection(const Deadline& deadline, bool retry_refused);
  Status handshake(int fd, const Deadline& deadline);

  // The connection pool: a call takes an idle connection (or opens one) and returns it after a
  // complete exchange. A connection that failed mid-exchange is closed, never reused.
  StatusOr<ScopedFd> take_connection(const Deadline& deadline);
  void return_connection(ScopedFd fd);

  const std::string host_;
  const int port_;
  const Duration timeout_;
  const std::string name_;
  const std::string secret_;
  // Declared before the pool so it is destroyed after the connections.
  std::unique_ptr<TcpStoreServer> server_;
  std::mutex pool_mutex_;
  std::vector<ScopedFd> idle_;
};

}  // namespace cohort::comm
