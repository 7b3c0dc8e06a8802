#pragma once

// DaemonServer: cohortd's gRPC server for the coordinator role. It opens the Coordinator on the
// data directory, serves cohort.v1.Info, Coordinator and Rendezvous plus grpc.health.v1, and runs
// the coordinator's periodic tick (node leases, placement) on its own thread.
//
//   DaemonServerOptions options;
//   options.listen = "127.0.0.1:0";          // port 0: the kernel picks; port() tells which
//   options.data_dir = "/var/lib/cohort";
//   COHORT_ASSIGN_OR_RETURN(auto server, DaemonServer::start(options));
//   std::printf("listening on %s\n", server->address().c_str());
//   ...
//   server->shutdown();                      // NOT_SERVING, stop ticking, drain with a deadline
//
// Orders for agents (launch / stop tasks) go to DaemonServerOptions::orders; the agent role that
// carries them out is not part of this server yet, so by default they are logged.
//
// Thread-safe: shutdown() may be called from any thread, more than once.

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/coordinator.h"
#include "daemon/service/coordinator_service.h"
#include "daemon/service/info_service.h"
#include "daemon/service/rendezvous_service.h"
#include "worker/base/status.h"

namespace cohort::daemon {

// How often the coordinator expires leases and places queued jobs (also done after each submit).
inline constexpr std::chrono::milliseconds kDefaultTickInterval = std::chrono::seconds(1);
// How long shutdown lets in-flight calls finish before cancelling them.
inline constexpr std::chrono::milliseconds kDefaultShutdownGrace = std::chrono::seconds(5);
// Where cohortd listens unless told otherwise (the CLI's default coordinator address).
inline constexpr const char* kDefaultListenAddress = "127.0.0.1:7070";

struct DaemonServerOptions {
  std::string listen = kDefaultListenAddress;                         // HOST:PORT; port 0 picks a free one
  std::string data_dir;                                               // job database directory (required)
  std::chrono::milliseconds tick_interval = kDefaultTickInterval;     // coordinator tick period
  std::chrono::milliseconds shutdown_grace = kDefaultShutdownGrace;   // drain limit for in-flight calls
  coordinator::Duration node_lease = coordinator::kDefaultNodeLease;  // a node silent this long is lost
  OrdersHandler orders;  // receives agent orders; empty: log them
};

class DaemonServer {
 public:
  // Opens the coordinator, binds `options.listen` and starts serving. INVALID_ARGUMENT for a
  // malformed address or missing data_dir; UNAVAILABLE when the address cannot be bound; the
  // coordinator's error when the data directory cannot be opened. Blocks on disk I/O.
  static StatusOr<std::unique_ptr<DaemonServer>> start(DaemonServerOptions options);

  DaemonServer(const DaemonServer&) = delete;
  DaemonServer& operator=(const DaemonServer&) = delete;
  // Calls shutdown().
  ~DaemonServer();

  // The port bound (the chosen one when listening on port 0).
  int port() const { return port_; }
  // HOST:PORT clients dial: the listen host with the bound port.
  const std::string& address() const { return address_; }
  // The coordinator this server serves (for in-process callers and tests); owned by the server.
  coordinator::Coordinator& coordinator() { return *coordinator_; }

  // Marks health NOT_SERVING, stops the tick thread, shuts the coordinator down (waking every
  // watcher and rendezvous waiter), and stops the server, cancelling calls still running after
  // options.shutdown_grace. Idempotent: concurrent and later calls wait for the first to finish.
  // Blocks up to about shutdown_grace.
  void shutdown();

 private:
  explicit DaemonServer(DaemonServerOptions options);
  void shutdown_once();
  void tick_loop();
  void dispatch(coordinator::AgentOrders orders) const;

  const DaemonServerOptions options_;
  coordinator::SystemClock clock_;
  std::unique_ptr<coordinator::Coordinator> coordinator_;
  std::unique_ptr<InfoService> info_service_;
  std::unique_ptr<CoordinatorService> coordinator_service_;
  std::unique_ptr<RendezvousService> rendezvous_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;

  std::mutex mu_;
  std::condition_variable stop_changed_;  // wakes the tick thread for shutdown
  bool stopping_ = false;
  std::once_flag shutdown_once_;
  std::thread tick_thread_;
};

}  // namespace cohort::daemon
