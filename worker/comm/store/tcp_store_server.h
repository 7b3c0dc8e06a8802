#pragma once

// TcpStoreServer: serves one KeyValueTable to TcpStore clients over TCP (c10d's TCPStore
// master). One thread runs a poll(2) loop over the listening socket and every client connection;
// a get or wait whose keys are missing parks as a waiter on the server, so a blocked client never
// blocks the others, and is answered when the keys appear or its timeout passes.
//
//   TcpStoreServerOptions options;
//   options.host = "127.0.0.1";  // port 0: any free port
//   COHORT_ASSIGN_OR_RETURN(auto server, TcpStoreServer::start(options));
//   COHORT_ASSIGN_OR_RETURN(auto store, TcpStore::connect("127.0.0.1", server->port(), timeout));
//
// Stopping (or destroying) the server closes every connection: clients' pending and later calls
// fail with UNAVAILABLE.

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/store/key_value_table.h"
#include "worker/comm/store/scoped_fd.h"
#include "worker/comm/store/tcp_store_protocol.h"
#include "worker/comm/store/wire_format.h"

namespace cohort::comm {

struct TcpStoreServerOptions {
  std::string host;  // address to bind; "" binds every interface (as torch's TCPStore master)
  int port = 0;      // port to bind; 0 lets the kernel pick one (port() reports it)
};

class TcpStoreServer {
 public:
  // Binds, listens and starts the serving thread. UNAVAILABLE (naming host:port) when the
  // address cannot be bound, e.g. the port is taken.
  static StatusOr<std::unique_ptr<TcpStoreServer>> start(const TcpStoreServerOptions& options);

  // Stops the server (see stop()).
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The bound port. Thread-safe.
  int port() const { return port_; }

  // Closes the listening socket and every client connection, and joins the serving thread.
  // Blocks for at most one loop iteration. Idempotent and thread-safe.
  void stop();

 private:
  struct Connection;
  struct Waiter;

  TcpStoreServer(ScopedFd listener, int port, ScopedFd wake_read, ScopedFd wake_write);

  // The serving thread. Everything below is touched only by it.
  void serve();
  int poll_timeout_ms() const;
  void accept_connections();
  void read_from(Connection& connection);
  void flush(Connection& connection);
  void close_connection(Connection& connection);
  // Handles the buffered complete requests of `connection` until it parks on a waiter.
  void handle_requests(Connection& connection);
  void handle_request(Connection& connection, std::string_view body);
  // Ops that wait: answer now if the keys exist, else park a waiter.
  void start_wait(Connection& connection, TcpStoreOp op, std::vector<std::string> keys, int64_t timeout_ms);
  // Answers every waiter whose keys all exist now (after a mutation) or whose time ran out.
  void complete_waiters();
  void reply_waiter(Connection& connection, const Waiter& waiter, bool timed_out);
  void reply_ok(Connection& connection, const WireWriter& result);
  void reply_error(Connection& connection, const Status& status,
                   const std::vector<std::string>& missing = {});
  void resume_parked_connections();

  const int port_;
  ScopedFd listener_;
  // stop() writes a byte to wake_write_ so the loop's poll returns and the thread exits.
  ScopedFd wake_read_;
  ScopedFd wake_write_;
  std::mutex stop_mutex_;
  std::thread thread_;

  KeyValueTable table_;
  std::map<int, std::unique_ptr<Connection>> connections_;  // by fd
  std::vector<Waiter> waiters_;
  // Connections whose waiter was just answered: their buffered requests are handled next.
  std::vector<int> resumable_;
};

}  // namespace cohort::comm
