#pragma once

// TcpStoreServer: serves one store to TcpStore clients over TCP (c10d's TCPStore master). One
// thread runs a poll(2) loop over the listening socket and every client connection and hands the
// bytes to a TcpStoreService (the protocol, the handshake, the store and every limit; see
// tcp_store_service.h); a get or wait whose keys are missing parks as a waiter there, so a
// blocked client never blocks the others.
//
//   TcpStoreServerOptions options;
//   options.host = "127.0.0.1";        // port 0: any free port
//   options.service.secret = secret;   // clients must prove they hold it (tcp_store_auth.h)
//   COHORT_ASSIGN_OR_RETURN(auto server, TcpStoreServer::start(options));
//   COHORT_ASSIGN_OR_RETURN(auto store, TcpStore::connect("127.0.0.1", server->port(), timeout, secret));
//
// A hostile or broken client is disconnected (logged at warn with its address, rate-limited);
// the store and the other clients go on. Beyond max_connections, new connections are accepted
// and closed at once. Stopping (or destroying) the server closes every connection: clients'
// pending and later calls fail with UNAVAILABLE.

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/store/scoped_fd.h"
#include "worker/comm/store/tcp_store_service.h"

namespace cohort::comm {

// Connections the server keeps open at once (also capped at half the process's RLIMIT_NOFILE,
// which the process needs for its other sockets too). One per rank and thread using the store.
inline constexpr size_t kTcpStoreMaxConnections = 8192;

struct TcpStoreServerOptions {
  // Address to bind: MASTER_ADDR, so the store listens on the interface the job uses and no
  // other. "" binds every interface (only for an explicitly configured standalone server).
  std::string host;
  int port = 0;  // port to bind; 0 lets the kernel pick one (port() reports it)
  size_t max_connections = kTcpStoreMaxConnections;
  TcpStoreServiceOptions service;  // the job secret and the per-connection and store limits
};

class TcpStoreServer {
 public:
  // Binds, listens and starts the serving thread. UNAVAILABLE (naming host:port) when the
  // address cannot be bound, e.g. the port is taken or the host is not an address of this
  // machine. Logs a warning when options.service.secret is empty (every client is accepted).
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
  struct Connection {
    ScopedFd fd;
    TcpStoreService::ConnectionId id;
    std::string peer;  // "10.0.0.7:51234", for logs
  };

  TcpStoreServer(const TcpStoreServerOptions& options, std::string where, ScopedFd listener, int port,
                 ScopedFd wake_read, ScopedFd wake_write, size_t max_connections);

  // The serving thread. Everything below is touched only by it.
  void serve();
  int poll_timeout_ms() const;
  void accept_connections();
  void read_from(Connection& connection);
  void flush(Connection& connection);
  void close_connection(int fd);
  // Closes the connections the service dropped, after a last best-effort send of their output.
  void close_dropped();
  // A warning about a client, at most kMaxClientWarningsPerWindow per window (then a count).
  void warn_client(const std::string& peer, const std::string& what);

  const std::string where_;  // "127.0.0.1:4567", for logs
  const int port_;
  const size_t max_connections_;
  ScopedFd listener_;
  // stop() writes a byte to wake_write_ so the loop's poll returns and the thread exits.
  ScopedFd wake_read_;
  ScopedFd wake_write_;
  std::mutex stop_mutex_;
  std::thread thread_;

  TcpStoreService service_;
  std::map<int, Connection> connections_;  // by fd
  std::unordered_map<TcpStoreService::ConnectionId, int> fds_;
  // accept() ran out of file descriptors: the listener is left alone until then, not spun on.
  Clock::time_point accept_paused_until_{};
  Clock::time_point warning_window_start_{};
  int warnings_in_window_ = 0;
  int warnings_suppressed_ = 0;
};

}  // namespace cohort::comm
