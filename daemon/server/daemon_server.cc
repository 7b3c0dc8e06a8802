#include "daemon/server/daemon_server.h"

#include <utility>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "daemon/coordinator/rendezvous.h"

namespace cohort::daemon {
namespace {

// HOST:PORT or [V6]:PORT with a numeric port 0..65535; returns the host as written.
StatusOr<std::string> listen_host(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  const std::string port = colon == std::string::npos ? "" : listen.substr(colon + 1);
  const bool numeric =
      !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  if (colon == 0 || !numeric || std::stoi(port) > 65535) {
    return invalid_argument_error(
        "listen address {:?} is not HOST:PORT (e.g. 127.0.0.1:7070, or port 0 for any free one)", listen);
  }
  return listen.substr(0, colon);
}

void log_orders(const coordinator::AgentOrders& orders) {
  for (const coordinator::LaunchOrder& launch : orders.launches) {
    spdlog::info("no agent client in this daemon: launch of job {} attempt {} on node {} ({} ranks) not sent",
                 launch.job_id, launch.attempt, launch.node.node_id, launch.node.num_ranks);
  }
  for (const coordinator::StopOrder& stop : orders.stops) {
    spdlog::info("no agent client in this daemon: stop of job {} attempt {} on node {} not sent ({})",
                 stop.job_id, stop.attempt, stop.node_id, stop.reason);
  }
}

}  // namespace

DaemonServer::DaemonServer(DaemonServerOptions options) : options_(std::move(options)) {}

StatusOr<std::unique_ptr<DaemonServer>> DaemonServer::start(DaemonServerOptions options) {
  if (options.data_dir.empty())
    return invalid_argument_error("data_dir is empty; give the coordinator a directory");
  if (options.tick_interval.count() <= 0) {
    return invalid_argument_error("tick_interval is {} ms; it must be positive",
                                  options.tick_interval.count());
  }
  COHORT_ASSIGN_OR_RETURN(std::string host, listen_host(options.listen));

  std::unique_ptr<DaemonServer> server(new DaemonServer(std::move(options)));
  coordinator::CoordinatorOptions coordinator_options;
  coordinator_options.data_dir = server->options_.data_dir;
  coordinator_options.node_lease = server->options_.node_lease;
  COHORT_ASSIGN_OR_RETURN(server->coordinator_,
                          coordinator::Coordinator::open(coordinator_options, &server->clock_));

  DaemonServer* self = server.get();
  server->info_service_ = std::make_unique<InfoService>(std::vector<std::string>{"coordinator"});
  server->coordinator_service_ = std::make_unique<CoordinatorService>(
      server->coordinator_.get(), &server->clock_,
      [self](coordinator::AgentOrders orders) { self->dispatch(std::move(orders)); });
  server->rendezvous_service_ = std::make_unique<RendezvousService>(server->coordinator_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second daemon on the same port would then start and
  // silently take half the calls. Binding must fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(server->options_.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->info_service_.get());
  builder.RegisterService(server->coordinator_service_.get());
  builder.RegisterService(server->rendezvous_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    server->coordinator_->shutdown();
    return unavailable_error(
        "cannot listen on {}: the address is in use or not local; pick another with --listen",
        server->options_.listen);
  }
  server->address_ = host.find(':') != std::string::npos && host.front() != '['
                         ? fmt::format("[{}]:{}", host, server->port_)
                         : fmt::format("{}:{}", host, server->port_);
  if (grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService()) {
    health->SetServingStatus(true);
  }
  server->tick_thread_ = std::thread([self] { self->tick_loop(); });
  spdlog::info("cohortd coordinator listening on {} (data in {})", server->address_,
               server->options_.data_dir);
  return server;
}

DaemonServer::~DaemonServer() { shutdown(); }

void DaemonServer::dispatch(coordinator::AgentOrders orders) const {
  if (orders.empty()) return;
  if (options_.orders) {
    options_.orders(std::move(orders));
  } else {
    log_orders(orders);
  }
}

void DaemonServer::tick_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (stop_changed_.wait_for(lock, options_.tick_interval, [this] { return stopping_; })) break;
    lock.unlock();
    dispatch(coordinator_->tick());
    lock.lock();
  }
}

void DaemonServer::shutdown() {
  // call_once: a second caller (the destructor after an explicit shutdown, a signal thread) waits
  // for the first to finish instead of racing it.
  std::call_once(shutdown_once_, [this] { shutdown_once(); });
}

void DaemonServer::shutdown_once() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_changed_.notify_all();
  if (server_ != nullptr) {
    // Load balancers and `grpc_health_probe` see the drain before calls start failing.
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService())
      health->SetServingStatus(false);
  }
  if (tick_thread_.joinable()) tick_thread_.join();
  // Wakes WatchJob streams and rendezvous waiters with UNAVAILABLE, so the drain below is quick.
  if (coordinator_ != nullptr) coordinator_->shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + options_.shutdown_grace);
    server_->Wait();
  }
}

}  // namespace cohort::daemon
