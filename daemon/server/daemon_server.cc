#include "daemon/server/daemon_server.h"

#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <cstdio>

#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <spdlog/spdlog.h>

#include "daemon/agent/agent_capabilities.h"
#include "daemon/agent/free_port.h"
#include "daemon/agent/leftover_tasks.h"
#include "daemon/agent/task_cgroups.h"
#include "daemon/metrics/coordinator_collector.h"
#include "daemon/metrics/rpc_metrics_interceptor.h"
#include "daemon/server/daemon_http.h"
#include "daemon/server/server_limits.h"
#include "daemon/coordinator/rendezvous.h"
#include "daemon/service/grpc_status.h"

namespace cohort::daemon {
namespace {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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

// Host names are case-insensitive; node ids are lower case (they name certificates).
std::string lower_case(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
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

StatusOr<DaemonRole> parse_daemon_role(const std::string& role) {
  if (role == "coordinator") return DaemonRole::kCoordinator;
  if (role == "agent") return DaemonRole::kAgent;
  if (role == "all") return DaemonRole::kAll;
  return invalid_argument_error("unknown role {:?}; use coordinator, agent or all", role);
}

StatusOr<std::unique_ptr<DaemonServer>> DaemonServer::start(DaemonServerOptions options) {
  if (options.data_dir.empty())
    return invalid_argument_error("data_dir is empty; give the daemon a directory");
  if (options.tick_interval.count() <= 0) {
    return invalid_argument_error("tick_interval is {} ms; it must be positive",
                                  options.tick_interval.count());
  }
  if (options.role != DaemonRole::kCoordinator) {
    if (options.slots < 1)
      return invalid_argument_error("slots is {}; an agent needs at least 1", options.slots);
    if (options.role == DaemonRole::kAgent && options.coordinator_address.empty())
      return invalid_argument_error("the agent role needs a coordinator address (--coordinator HOST:PORT)");
    if (!options.coordinator_address.empty())
      COHORT_RETURN_IF_ERROR(tls::parse_address_list(options.coordinator_address).status());
    if (options.worker_command.empty() || options.worker_command[0].empty() ||
        options.worker_command[0][0] != '/') {
      return invalid_argument_error("worker_command must start with an absolute path, e.g. {}",
                                    kDefaultWorkerPath);
    }
    // A root agent without CAP_SYS_PTRACE under a hidepid /proc would find no stopped rank and no
    // worker left behind, silently: it refuses to start; with a plain /proc only the leftover
    // cleanup goes blind, which it says once (agent_capabilities.h).
    std::string capability_warning;
    COHORT_RETURN_IF_ERROR(agent::check_root_agent_capabilities(&capability_warning));
    if (!capability_warning.empty()) spdlog::warn("{}", capability_warning);
  }
  COHORT_ASSIGN_OR_RETURN(std::string host, listen_host(options.listen));

  std::unique_ptr<DaemonServer> server(new DaemonServer(std::move(options)));
  DaemonServer* self = server.get();
  std::vector<std::string> roles;
  grpc::EnableDefaultHealthCheckService(true);
  // Server reflection (grpcurl, grpc_cli): the schema of what this daemon serves, to any
  // authenticated caller (security::method_policy()); it reveals nothing the .proto files do not.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second daemon on the same port would then start and
  // silently take half the calls. Binding must fail instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients ping every 30 s even when idle (client/client.h kKeepaliveTime) so a `submit -f` or
  // `logs -f` notices a dead daemon; by default gRPC answers such pings with GOAWAY
  // ("too_many_pings") and closes the stream, so accept them down to kMinClientPingInterval.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(kMinClientPingInterval.count()));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  apply_server_limits(builder);
  // /metrics counts and times every call through an interceptor, so no handler changes.
  server->metrics_ = std::make_unique<metrics::DaemonMetrics>();
  builder.experimental().SetInterceptorCreators(metrics::rpc_metrics_interceptors(server->metrics_.get()));

  // The node id is needed before the port opens: it names this node's certificate.
  char hostname[256] = {};
  if (gethostname(hostname, sizeof(hostname) - 1) != 0) std::snprintf(hostname, sizeof(hostname), "node");
  // One agent per machine is the deployment, so the host name is a unique default id.
  if (server->has_agent())
    server->node_id_ = server->options_.node_id.empty() ? lower_case(hostname) : server->options_.node_id;
  security::DaemonSecurityOptions security_options;
  security_options.coordinator = server->has_coordinator();
  security_options.agent = server->has_agent();
  security_options.data_dir = server->options_.data_dir;
  security_options.listen_host = host;
  security_options.node_id = server->node_id_;
  security_options.coordinator_address = server->options_.coordinator_address;
  security_options.join_token = server->options_.join_token;
  security_options.insecure = server->options_.insecure;
  // The data directory is traversable (0711) but not listable: job users reach their own job
  // directory under it; keys and databases inside are private on their own.
  std::error_code created;
  if (std::filesystem::create_directories(server->options_.data_dir, created)) {
    ::chmod(server->options_.data_dir.c_str(), 0711);
  } else if (created) {
    return internal_error("cannot create the data directory {}: {}", server->options_.data_dir, created.message());
  }
  COHORT_ASSIGN_OR_RETURN(server->security_, security::DaemonSecurity::open(security_options));
  // An alert on this gauge catches a node certificate nobody renewed (security::kRenewalWindowDivisor).
  if (server->has_agent() && !server->security_->insecure())
    server->metrics_->set_node_certificate_expiry(server->security_->node_certificate_info().not_after_unix);
  // A standby that cannot verify a caller (credentials made after it was seeded) answers UNAVAILABLE,
  // so the client tries the next coordinator (issue 16, AuthenticatorOptions::standby_refusal).
  if (server->has_coordinator())
    server->security_->set_standby_refusal([self] { return self->gate_ == nullptr ? "" : self->gate_->refusal(); });
  builder.AddListeningPort(server->options_.listen, server->security_->server_credentials(), &server->port_);

  if (server->has_coordinator()) {
    roles.push_back("coordinator");
    // The services are served through the leadership gate (issue 16): a standby answers every
    // call UNAVAILABLE naming the leader, and opens its Coordinator only once it leads.
    server->gate_ = std::make_unique<LeaderGate>(server->options_.listen);
    server->gated_coordinator_ = std::make_unique<GatedCoordinatorService>(server->gate_.get());
    server->gated_rendezvous_ = std::make_unique<GatedRendezvousService>(server->gate_.get());
    builder.RegisterService(server->gated_coordinator_.get());
    builder.RegisterService(server->gated_rendezvous_.get());
    if (!server->options_.standby && server->options_.election.empty())
      COHORT_RETURN_IF_ERROR(server->open_coordinator());
  }
  if (server->has_agent()) {
    roles.push_back("agent");
    agent::TaskSupervisorOptions supervisor_options;
    supervisor_options.log_dir =
        server->options_.log_dir.empty() ? server->options_.data_dir + "/logs" : server->options_.log_dir;
    supervisor_options.stop_grace_period = server->options_.stop_grace_period;
    supervisor_options.max_log_bytes_per_job = server->options_.max_log_bytes_per_job;
    supervisor_options.log_retention = server->options_.job_retention;
    // The jobs' own directories (AgentService's job_dir_root below) go after job_retention too.
    supervisor_options.job_dir_root = server->options_.data_dir + "/jobs";
    supervisor_options.stopped_task_limit = server->options_.stopped_task_limit;
    supervisor_options.heartbeat_timeout = server->options_.task_heartbeat_timeout;
    supervisor_options.heartbeat_interval = server->options_.task_heartbeat_interval;
    supervisor_options.exec_timeout = server->options_.exec_timeout;
    supervisor_options.slots = server->options_.slots;  // the ranks' default OMP_NUM_THREADS
    if (server->options_.role == DaemonRole::kAll &&
        server->options_.exec_timeout >= server->options_.peer_rpc_timeout) {
      // A node's ranks exec one after another inside one LaunchTasks call, whose deadline is
      // peer_rpc_timeout. That deadline is not sized from exec_timeout: the single dispatch thread
      // waits out each launch call, and a node that never answers would hold every launch and stop
      // behind it that much longer.
      spdlog::warn("exec_timeout_ms ({} ms) is not less than peer_rpc_timeout_ms ({} ms): a launch held up by a "
                   "task's exec (a hung mount) outlasts the LaunchTasks deadline, so the coordinator fails the "
                   "attempt with a bare 'deadline exceeded' instead of the agent's error naming the directory or "
                   "program; for that error, keep exec_timeout_ms below peer_rpc_timeout_ms divided by the ranks "
                   "per node",
                   server->options_.exec_timeout.count(), server->options_.peer_rpc_timeout.count());
    }
    // The node id and addresses are known only once the port is bound; the supervisor gets the
    // coordinator address it can know now (COHORT_COORDINATOR), the node id below.
    supervisor_options.coordinator_address = server->options_.coordinator_address;
    supervisor_options.node_id = server->node_id_;
    server->supervisor_ = std::make_unique<agent::TaskSupervisor>(
        supervisor_options, &server->launcher_, [self](const agent::TaskExit& exit) {
          // Runs on the supervisor's threads: only queue it (STYLE: no RPC inside the callback).
          self->metrics_->record_task_exit(
              metrics::task_exit_reason(exit.status.exit_code, exit.status.signal, exit.stopped));
          {
            std::lock_guard<std::mutex> lock(self->mu_);
            self->exits_queue_.push_back(exit);
          }
          self->exits_changed_.notify_all();
        });
    AgentServiceOptions agent_options;
    agent_options.node_id = server->node_id_;
    agent_options.slots = server->options_.slots;
    agent_options.worker_command = server->options_.worker_command;
    agent_options.spec_dir = supervisor_options.log_dir;
    agent_options.coordinator_address = server->options_.coordinator_address;
    agent_options.ca_certificate_pem = server->security_->ca_pem();
    agent_options.job_dir_root = server->options_.data_dir + "/jobs";
    // Each task in a cgroup v2 of its own (agent/task_cgroups.h) where this host has one the agent
    // may write: what a rank moves out of its process group (setsid, a daemonizing tool, a double
    // fork) then ends with the rank. The data directory names this agent's part (agents may share
    // a machine and a cgroup); what an earlier run left in it goes before anything is launched.
    // Its canonical path, so that "/var/lib/cohort/" and "/var/lib/cohort" are one agent.
    agent::TaskCgroupsOptions cgroup_options;
    cgroup_options.agent_key = agent::agent_key_for_data_dir(server->options_.data_dir);
    StatusOr<std::shared_ptr<agent::TaskCgroups>> cgroups = agent::TaskCgroups::open(cgroup_options);
    if (cgroups.ok()) {
      for (const agent::LeftoverCgroup& left : (*cgroups)->remove_leftovers()) {
        const std::string kept =
            left.removed.ok() ? "" : fmt::format("; the cgroup stays: {}", left.removed.to_string());
        spdlog::warn("agent: killed pids [{}] left in cgroup {} by an earlier run of this agent{}",
                     fmt::join(left.pids, " "), left.path, kept);
      }
      server->launcher_.set_task_cgroups(*cgroups);
      spdlog::info("agent: task containment on: each task runs in a cgroup of its own under {}, killed "
                   "with {} when the task ends or is stopped",
                   (*cgroups)->path(),
                   (*cgroups)->uses_cgroup_kill() ? "cgroup.kill"
                                                  : "the freezer and SIGKILL (no cgroup.kill before 5.14)");
    } else {
      // A warning for a node agent; `cohort run`'s in-process agents (one user's own, unprivileged)
      // rarely have a delegated cgroup, and a warning per node there would only be noise.
      const bool own_user_only = server->options_.run_jobs_as_daemon_user && ::geteuid() != 0;
      spdlog::log(own_user_only ? spdlog::level::info : spdlog::level::warn,
                  "agent: task containment off: {}. Looked for a cgroup2 mount in /proc/self/mountinfo and "
                  "this process's cgroup (the \"0::\" line of /proc/self/cgroup), to make "
                  "{}/<data dir>/<task> there. Tasks run in process groups only, so a process a task moves "
                  "out of its group (setsid, a daemonizing tool, a double fork) can outlive its job and hold "
                  "this node's resources",
                  cgroups.status().message(), agent::kTaskCgroupsDirectory);
    }
    server->metrics_->set_task_containment(cgroups.ok());
    // Before this agent launches anything: what an earlier run of it left behind (children of its
    // ranks, which outlive a killed agent) would hold the slots the coordinator hands out again.
    for (const agent::LeftoverTask& task : agent::kill_leftover_tasks(agent_options.job_dir_root)) {
      spdlog::warn("agent: killed pid {} ({}), left behind in {} by an earlier run of this agent", task.pid,
                   task.command, task.job_dir);
    }
    agent_options.job_user = server->options_.job_user;
    agent_options.user_map = server->options_.user_map;
    agent_options.shared_job_user = server->options_.shared_job_user;
    agent_options.run_jobs_as_daemon_user = server->options_.run_jobs_as_daemon_user;
    agent_options.allowed_path_roots = server->options_.allowed_path_roots;
    agent_options.allowed_commands = server->options_.allowed_commands;
    // A launch under way ends within its tasks' exec deadlines: the drain waits that long for it.
    agent_options.drain_launch_wait = server->options_.exec_timeout;
    server->agent_service_ = std::make_unique<AgentService>(server->supervisor_.get(), agent_options);
    builder.RegisterService(server->agent_service_.get());
  }
  server->info_service_ = std::make_unique<InfoService>(roles);
  builder.RegisterService(server->info_service_.get());

  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    if (server->coordinator_ != nullptr) server->coordinator_->shutdown();
    return unavailable_error(
        "cannot listen on {}: the address is in use or not local; pick another with --listen",
        server->options_.listen);
  }
  // Every service starts NOT_SERVING; set_up() below, once the daemon's threads run.
  std::vector<std::string> served = {kInfoService};
  if (server->has_coordinator()) served.insert(served.end(), {kCoordinatorService, kRendezvousService});
  if (server->has_agent()) served.push_back(kAgentService);
  server->health_ = std::make_unique<HealthState>(server->server_->GetHealthCheckService(), served);
  server->address_ = host.find(':') != std::string::npos && host.front() != '['
                         ? fmt::format("[{}]:{}", host, server->port_)
                         : fmt::format("{}:{}", host, server->port_);
  if (server->has_coordinator()) {
    server->gate_->set_self(server->advertised_address());
    if (server->coordinator_service_ != nullptr) server->coordinator_service_->set_address(server->advertised_address());
    // With identities in etcd, a coordinator that does not lead yet makes no admin of its own: the
    // cluster may have one already, and etcd's identities replace the local ones when it leads
    // (become_leader makes the first admin then, if the cluster has none).
    if (server->coordinator_ != nullptr) {
      COHORT_RETURN_IF_ERROR(server->follow_identities());
    } else if (server->options_.job_store.empty()) {
      COHORT_RETURN_IF_ERROR(server->security_->write_first_admin_credentials(server->address_));
    }
  }
  if (!server->options_.http_listen.empty()) {
    DaemonHttpOptions http_options;
    http_options.listen = server->options_.http_listen;
    http_options.token_file = server->options_.http_token_file;
    http_options.security = server->security_.get();
    http_options.metrics = server->metrics_.get();
    // The dashboard reads the Coordinator while this daemon leads (a standby opens none until it is
    // elected; leading() is an acquire of what become_leader published).
    if (server->has_coordinator())
      http_options.coordinator = [self]() { return self->leading() ? self->coordinator_.get() : nullptr; };
    http_options.clock = &server->clock_;
    COHORT_ASSIGN_OR_RETURN(server->http_server_, create_daemon_http(http_options));
    COHORT_RETURN_IF_ERROR(server->http_server_->start());
    spdlog::info("cohortd serves /metrics{} on {}", server->has_coordinator() ? " and the dashboard" : "",
                 server->http_server_->url());
  }
  server->tick_healthy_until_ns_ = server->healthy_deadline_ns(server->options_.tick_interval);
  server->agent_healthy_until_ns_ = server->healthy_deadline_ns(std::chrono::milliseconds(0));
  if (server->coordinator_ != nullptr) {
    server->start_leading_threads();
  } else if (server->has_coordinator()) {
    // A standby: NOT_SERVING for the coordinator's services until it leads.
    for (const char* service : {kCoordinatorService, kRendezvousService}) {
      Status standby = server->health_->set_serving(service, false);
      if (!standby.ok()) spdlog::warn("health of {}: {}", service, standby.to_string());
    }
    server->gate_->follow(server->options_.standby_leader);
    spdlog::info("cohortd at {} is a standby coordinator (leader: {})", server->advertised_address(),
                 server->options_.standby_leader.empty() ? "not known yet" : server->options_.standby_leader);
  }
  if (server->has_agent()) server->start_agent();
  server->health_->set_up();
  // Campaign only once this daemon answers as a standby: clients that reach it meanwhile are told
  // to wait for the election.
  if (server->has_coordinator() && !server->options_.election.empty()) {
    Status campaigning = server->start_election();
    if (!campaigning.ok()) {
      server->shutdown();
      return campaigning;
    }
  }
  spdlog::info("cohortd {} listening on {} (data in {})", fmt::join(roles, "+"), server->address_,
               server->options_.data_dir);
  return server;
}

DaemonServer::~DaemonServer() { shutdown(); }

bool DaemonServer::healthy() const {
  if (shutting_down_) return true;  // the loops are ending on purpose; TimeoutStopSec bounds it
  const int64_t now = steady_now_ns();
  if (leading_threads_ && now > tick_healthy_until_ns_.load()) return false;
  if (has_agent() && now > agent_healthy_until_ns_.load()) return false;
  return true;
}

int64_t DaemonServer::healthy_deadline_ns(std::chrono::milliseconds idle) const {
  return steady_now_ns() +
         std::chrono::duration_cast<std::chrono::nanoseconds>(idle + options_.max_loop_silence).count();
}

void DaemonServer::dispatch(coordinator::AgentOrders orders) {
  if (orders.empty()) return;
  if (options_.orders) {
    options_.orders(std::move(orders));
    return;
  }
  // Called on gRPC handler threads and the tick thread, some holding nothing the dispatch thread
  // needs; queueing keeps a slow agent from delaying the coordinator's answers.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      log_orders(orders);
      return;
    }
    orders_queue_.push_back(std::move(orders));
  }
  orders_changed_.notify_all();
}

void DaemonServer::dispatch_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto woken = [this] { return stopping_ || !orders_queue_.empty(); };
    if (stop_retries_.empty()) {
      orders_changed_.wait(lock, woken);
    } else {
      auto due = stop_retries_.front().due;
      for (const PendingStop& pending : stop_retries_) due = std::min(due, pending.due);
      orders_changed_.wait_until(lock, due, woken);
    }
    if (stopping_) {
      for (const coordinator::AgentOrders& orders : orders_queue_) log_orders(orders);
      orders_queue_.clear();
      return;
    }
    coordinator::AgentOrders orders;
    if (!orders_queue_.empty()) {
      orders = std::move(orders_queue_.front());
      orders_queue_.pop_front();
    }
    lock.unlock();
    if (!gate_->leading()) {
      // Lost the leadership: the new leader owns the agents now (its nodes' registrations tell it
      // what still runs, and it stops what it does not own).
      log_orders(orders);
      for (const PendingStop& pending : stop_retries_) {
        spdlog::info("stop of job {} attempt {} on node {} not sent again: this coordinator no longer leads",
                     pending.order.job_id, pending.order.attempt, pending.order.node_id);
      }
      stop_retries_.clear();
      lock.lock();
      continue;
    }
    retry_stops();
    // Stops first: a restart's stop and launch may arrive together, and slots free on stop.
    for (const coordinator::StopOrder& stop : orders.stops) send_stop(stop);
    for (const coordinator::LaunchOrder& launch : orders.launches) {
      // Queued orders can be stale: the attempt may have been cancelled, failed or restarted
      // since; launching it would start tasks no one stops.
      if (!attempt_is_active(launch.job_id, launch.attempt)) {
        spdlog::info("launch of job {} attempt {} on node {} skipped: the attempt is no longer active",
                     launch.job_id, launch.attempt, launch.node.node_id);
        // The node never hears of the attempt, so no exit report will free its slots: do it here.
        Status released = coordinator_->report_launch_skipped(launch.node.node_id, launch.job_id, launch.attempt);
        if (!released.ok()) {
          spdlog::warn("job {} attempt {}: the slots of its skipped launch on node {} stay reserved: {}",
                       launch.job_id, launch.attempt, launch.node.node_id, released.to_string());
        }
        continue;
      }
      send_launch(launch);
    }
    lock.lock();
  }
}

bool DaemonServer::attempt_is_active(const std::string& job_id, int attempt) const {
  StatusOr<coordinator::Job> job = coordinator_->get_job(job_id);
  if (!job.ok() || job->attempt() != attempt) return false;
  // PLACED while its nodes launch; RUNNING once all did (a late order for one of them).
  return job->state() == coordinator::JobState::kPlaced || job->state() == coordinator::JobState::kRunning;
}

cohort::v1::Agent::Stub& DaemonServer::agent_stub(const std::string& address, const std::string& node_id) {
  std::unique_ptr<cohort::v1::Agent::Stub>& stub = agent_stubs_[address + "/" + node_id];
  if (stub == nullptr) {
    stub = cohort::v1::Agent::NewStub(tls::make_channel(address, security_->to_agent(node_id)));
  }
  return *stub;
}

void DaemonServer::send_launch(const coordinator::LaunchOrder& order) {
  cohort::v1::LaunchTasksRequest request;
  request.set_job_id(order.job_id);
  request.set_attempt(order.attempt);
  *request.mutable_spec() = order.spec;
  request.set_world_size(order.world_size);
  request.set_num_nodes(order.num_nodes);
  request.set_node_rank(order.node.node_rank);
  request.set_master_address(order.master_address);
  request.set_coordinator_address(address_);
  request.set_master_port(master_port_for(order));
  request.set_job_secret(security_->attempt_secret(order.job_id, order.attempt));
  // The owner decides the Unix user the tasks run as (user_map, job_user): a launch without one
  // is not sent (an agent running it as job_user refuses it), it fails like a refused launch.
  StatusOr<coordinator::Job> job = coordinator_->get_job(order.job_id);
  if (job.ok()) request.set_owner(job->owner);
  for (int local_rank = 0; local_rank < order.node.num_ranks; ++local_rank) {
    cohort::v1::Task* task = request.add_tasks();
    task->set_rank(order.node.first_rank + local_rank);
    task->set_local_rank(local_rank);
    for (int gpu : order.node.gpus_of(local_rank)) task->add_gpus(gpu);
  }
  cohort::v1::LaunchTasksResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.peer_rpc_timeout);
  Status status =
      !job.ok() ? failed_precondition_error("job {} attempt {} was not launched on node {}: its owner could not be "
                                            "read from the job store: {}",
                                            order.job_id, order.attempt, order.node.node_id,
                                            job.status().to_string())
                : from_grpc_status(agent_stub(order.node.address, order.node.node_id).LaunchTasks(&context, request, &response),
                                   "Agent.LaunchTasks", order.node.address);
  if (!status.ok()) {
    // Nothing runs there, so the attempt can never start: fail it now (the restart policy decides
    // what follows) instead of leaving it PLACED until someone cancels it.
    spdlog::error("launch of job {} attempt {} on node {} failed: {}", order.job_id, order.attempt,
                  order.node.node_id, status.to_string());
    // No answer: the agent is dead, stopped or cut off, and the node must not get the restart too.
    const bool unreachable =
        status.code() == StatusCode::kDeadlineExceeded || status.code() == StatusCode::kUnavailable;
    StatusOr<coordinator::AgentOrders> orders = coordinator_->report_launch_failure(
        order.node.node_id, order.job_id, order.attempt, status.message(),
        unreachable ? coordinator::LaunchFailure::kUnreachable : coordinator::LaunchFailure::kRefused);
    if (!orders.ok()) {
      // The attempt then fails when its start deadline passes (CoordinatorOptions::start_timeout).
      spdlog::warn("job {} attempt {}: the coordinator refused the launch failure report: {}", order.job_id,
                   order.attempt, orders.status().to_string());
    } else {
      dispatch(std::move(orders).value());
    }
    if (unreachable) {
      // The call may have reached the agent and started tasks before the answer was lost: stop
      // them, or they run unaccounted for (an agent that knows no such attempt answers OK).
      coordinator::StopOrder stop;
      stop.node_id = order.node.node_id;
      stop.address = order.node.address;
      stop.job_id = order.job_id;
      stop.attempt = order.attempt;
      stop.reason = "launch timed out: " + status.message();
      send_stop(stop);
    }
    return;
  }
  Status started = coordinator_->report_tasks_started(order.node.node_id, order.job_id, order.attempt);
  if (!started.ok()) {
    spdlog::warn("job {} attempt {} started on node {} but the coordinator refused the report: {}",
                 order.job_id, order.attempt, order.node.node_id, started.to_string());
  }
}

int DaemonServer::master_port_for(const coordinator::LaunchOrder& order) {
  const std::pair<std::string, int> key{order.job_id, order.attempt};
  auto it = master_ports_.find(key);
  if (it != master_ports_.end()) return it->second;
  // Free on this host; on the master node it is free with high probability (the kernel hands
  // ephemeral ports out in turn), and 0 makes the agent pick one, right for a one-node attempt.
  StatusOr<int> port = agent::pick_free_port();
  if (!port.ok()) spdlog::warn("job {}: no free MASTER_PORT: {}", order.job_id, port.status().to_string());
  const int chosen = port.ok() ? *port : 0;
  // Only the newest attempts matter: a restart gets a fresh port, so keep the map small.
  if (master_ports_.size() > 1024) master_ports_.erase(master_ports_.begin());
  master_ports_[key] = chosen;
  return chosen;
}

void DaemonServer::send_stop(const coordinator::StopOrder& order, int failures) {
  cohort::v1::StopTasksRequest request;
  request.set_job_id(order.job_id);
  request.set_attempt(order.attempt);
  request.set_reason(order.reason);
  cohort::v1::StopTasksResponse response;
  grpc::ClientContext context;
  // The agent answers once its tasks are reaped: up to its grace period plus the SIGKILL wait. A
  // retry goes to a node that did not answer before: it gets one call's time, so an unreachable
  // node holds the dispatch thread (and every launch behind it) no longer than a launch would; a
  // stop it cuts short is sent again and finds the tasks stopping or gone.
  context.set_deadline(std::chrono::system_clock::now() + options_.peer_rpc_timeout +
                       (failures > 0 ? std::chrono::milliseconds(0)
                                     : std::chrono::duration_cast<std::chrono::milliseconds>(
                                           options_.stop_grace_period + agent::kKillWaitTimeout)));
  Status status = from_grpc_status(agent_stub(order.address, order.node_id).StopTasks(&context, request, &response),
                                   "Agent.StopTasks", order.address);
  // NOT_FOUND: the agent holds no task of the job (the launch never reached it, or the tasks ended
  // and were forgotten), so nothing of the attempt runs there: the stop is done.
  if (status.ok() || status.code() == StatusCode::kNotFound) {
    if (failures > 0) {
      spdlog::info("stop of job {} attempt {} on node {} taken after {} failed tr{}", order.job_id, order.attempt,
                   order.node_id, failures, failures == 1 ? "y" : "ies");
    }
    return;
  }
  // A request the agent can never take (a version without StopTasks, a malformed order) is not
  // sent again; anything else (no answer, a handshake failing under load, a busy agent) is.
  if (status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kUnimplemented) {
    spdlog::error("stop of job {} attempt {} on node {} failed and is not sent again: {}", order.job_id,
                  order.attempt, order.node_id, status.to_string());
    return;
  }
  if (failures + 1 >= kMaxStopTries) {
    spdlog::error("stop of job {} attempt {} on node {} failed {} times and is not sent again: {}; if its tasks "
                  "still run there, the reply to the node's next heartbeat that gets through stops them (its agent "
                  "reports what it runs), and so do the node's next registration and, once the node loses its "
                  "lease, its agent itself; an agent too old to report what it runs gets only the last two, "
                  "otherwise kill the job's processes on node {} by hand",
                  order.job_id, order.attempt, order.node_id, failures + 1, status.to_string(), order.node_id);
    return;
  }
  std::chrono::milliseconds wait = kStopRetryInterval;
  for (int i = 0; i < failures && wait < kMaxStopRetryInterval; ++i) wait *= 2;
  wait = std::min(wait, kMaxStopRetryInterval);
  spdlog::error("stop of job {} attempt {} on node {} failed (try {}): {}; sending it again in {} ms while the "
                "node is registered",
                order.job_id, order.attempt, order.node_id, failures + 1, status.to_string(), wait.count());
  stop_retries_.push_back(PendingStop{order, failures + 1, std::chrono::steady_clock::now() + wait});
}

void DaemonServer::retry_stops() {
  if (stop_retries_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  std::vector<PendingStop> due;
  for (auto it = stop_retries_.begin(); it != stop_retries_.end();) {
    if (it->due <= now) {
      due.push_back(std::move(*it));
      it = stop_retries_.erase(it);
    } else {
      ++it;
    }
  }
  if (due.empty()) return;
  // Only to nodes still registered at the address the order names: a lost node's agent stops its
  // tasks itself when its lease lapses (fencing), and a node that registered again reported what
  // it runs, and the registration's orders stop what is over.
  std::map<std::string, std::string> registered;
  for (const coordinator::NodeStatus& node : coordinator_->list_nodes()) {
    if (!node.awaiting_registration) registered[node.info.node_id] = node.info.address;
  }
  for (const PendingStop& pending : due) {
    {
      // Shutdown waits for this thread: it must not wait out one call per pending stop.
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        spdlog::info("stop of job {} attempt {} on node {} not sent again: cohortd is shutting down",
                     pending.order.job_id, pending.order.attempt, pending.order.node_id);
        continue;
      }
    }
    auto node = registered.find(pending.order.node_id);
    if (node == registered.end() || node->second != pending.order.address) {
      spdlog::warn("stop of job {} attempt {} on node {} dropped after {} failed tr{}: the node {}", pending.order.job_id,
                   pending.order.attempt, pending.order.node_id, pending.failures,
                   pending.failures == 1 ? "y" : "ies",
                   node == registered.end() ? "is gone" : "registered again at " + node->second);
      continue;
    }
    send_stop(pending.order, pending.failures);
  }
}

void DaemonServer::start_agent() {
  agent_service_->set_address(address_);
  const std::string coordinator_address =
      options_.coordinator_address.empty() ? address_ : options_.coordinator_address;
  // A list of coordinators (issue 16): registration, heartbeats and exit reports follow the leader.
  StatusOr<std::vector<std::string>> addresses = tls::parse_address_list(coordinator_address);
  node_certificate_generation_ = security_->node_certificate_generation();
  coordinator_leader_ = std::make_unique<tls::LeaderChannel>(
      addresses.ok() ? *addresses : std::vector<std::string>{coordinator_address}, security_->to_coordinator());
  agent_thread_ = std::thread([this] { agent_loop(); });
}

void DaemonServer::agent_loop() {
  using Clock = std::chrono::steady_clock;
  bool registered = false;
  Clock::time_point next_contact = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // Idle until next_contact at most, then one iteration's work must fit in max_loop_silence.
    agent_healthy_until_ns_ = healthy_deadline_ns(
        std::max(std::chrono::milliseconds(0),
                 std::chrono::duration_cast<std::chrono::milliseconds>(next_contact - Clock::now())));
    exits_changed_.wait_until(lock, next_contact, [this] { return stopping_ || !exits_queue_.empty(); });
    if (stopping_) break;
    std::deque<agent::TaskExit> exits;
    exits.swap(exits_queue_);
    exits_in_flight_ = static_cast<int>(exits.size());
    lock.unlock();
    // The node certificate was renewed (DaemonSecurity's hourly check): calls present the new one.
    // The channel object stays (set_credentials swaps under its own lock): drain() heartbeats
    // through it from the SIGTERM path while this thread runs.
    if (const uint64_t generation = security_->node_certificate_generation();
        generation != node_certificate_generation_) {
      node_certificate_generation_ = generation;
      coordinator_leader_->set_credentials(security_->to_coordinator());
      metrics_->set_node_certificate_expiry(security_->node_certificate_info().not_after_unix);
    }

    if (registered && Clock::now() >= next_contact) {
      const Clock::time_point sent = Clock::now();
      Status beat = heartbeat();
      if (beat.ok()) last_renewal_ = sent;
      if (beat.code() == StatusCode::kNotFound) {
        spdlog::warn("the coordinator does not know node {} ({}); registering again", node_id_,
                     beat.to_string());
        registered = false;
      } else if (!beat.ok()) {
        spdlog::warn("heartbeat of node {} failed: {}", node_id_, beat.to_string());
      }
      next_contact = registered ? Clock::now() + heartbeat_interval_ : Clock::now();
    }
    if (!registered && Clock::now() >= next_contact) {
      const Clock::time_point sent = Clock::now();
      Status status = register_node();
      registered = status.ok();
      if (registered) last_renewal_ = sent;
      if (!registered) spdlog::warn("registering node {} failed: {}; retrying", node_id_, status.to_string());
      next_contact = Clock::now() + (registered ? heartbeat_interval_ : kRegisterRetryInterval);
    }
    // Fencing (issue 16): with no renewal for a whole lease, the coordinator has declared this node
    // lost and may have restarted its attempts elsewhere; the tasks here stop before the node
    // registers again, so two attempts of a job never run (and write its checkpoints) at once.
    if (last_renewal_.has_value() && Clock::now() - *last_renewal_ >= lease_) {
      fence_tasks();
      last_renewal_.reset();  // once per loss of the lease
      registered = false;
      next_contact = Clock::now();
    } else if (last_renewal_.has_value()) {
      next_contact = std::min(next_contact, *last_renewal_ + lease_);
    }
    std::deque<agent::TaskExit> retry;
    for (const agent::TaskExit& exit : exits) {
      Status status = report_exit(exit);
      if (status.code() == StatusCode::kUnavailable || status.code() == StatusCode::kDeadlineExceeded) {
        retry.push_back(exit);  // the coordinator is restarting; the exit must not be lost
        next_contact = std::min(next_contact, Clock::now() + kRegisterRetryInterval);
      } else if (!status.ok()) {
        spdlog::warn("exit report for job {} rank {} refused: {}", exit.job_id, exit.rank,
                     status.to_string());
      }
    }
    lock.lock();
    exits_queue_.insert(exits_queue_.begin(), retry.begin(), retry.end());
    exits_in_flight_ = 0;
    exits_reported_.notify_all();
  }
}

Status DaemonServer::register_node() {
  COHORT_ASSIGN_OR_RETURN(cohort::v1::NodeInfo node, agent_service_->describe_node());
  cohort::v1::RegisterNodeRequest request;
  *request.mutable_node() = std::move(node);
  // What still runs here, and how the tasks that ended did: the coordinator keeps what it owns
  // and orders the rest stopped. The exits go with it because a coordinator that restarted (or took
  // over) since may not have heard of them, and the exit reports still queued here arrive after
  // this registration: without them it would wait for ranks that are gone, or take a node whose
  // ranks all finished for one that lost them.
  for (const std::string& job_id : supervisor_->jobs()) {
    std::optional<int> attempt = agent_service_->attempt_of(job_id);
    StatusOr<std::vector<agent::TaskInfo>> tasks = supervisor_->tasks(job_id);
    if (!attempt.has_value() || !tasks.ok()) continue;
    cohort::v1::RunningAttempt* running = request.add_running();
    running->set_job_id(job_id);
    running->set_attempt(*attempt);
    for (const agent::TaskInfo& task : *tasks) {
      if (!task.exit.has_value()) {
        running->add_ranks(task.rank);
        continue;
      }
      cohort::v1::ExitedRank* exited = running->add_exited();
      exited->set_rank(task.rank);
      exited->set_exit_code(task.exit->exit_code);
      exited->set_signal(task.exit->signal);
      // As report_exit words it.
      exited->set_detail(!task.detail.empty() || fenced_.count({job_id, *attempt}) == 0
                             ? task.detail
                             : fenced_detail());
    }
  }
  cohort::v1::RegisterNodeResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options_.peer_rpc_timeout);
  // The call first: the error then names the coordinator that answered (the leader moves).
  const grpc::Status registered = coordinator_leader_->idempotent_unary<cohort::v1::Coordinator>(
      std::chrono::system_clock::now() + options_.peer_rpc_timeout, &cohort::v1::Coordinator::Stub::RegisterNode,
      request, &response);
  COHORT_RETURN_IF_ERROR(
      from_grpc_status(registered, "Coordinator.RegisterNode", coordinator_leader_->leader_address()));
  // The coordinator asks for lease / 3, so two lost heartbeats still keep the node.
  heartbeat_interval_ = response.heartbeat_interval_ms() > 0
                            ? std::chrono::milliseconds(response.heartbeat_interval_ms())
                            : std::chrono::milliseconds(response.lease_ms() / 3);
  if (heartbeat_interval_.count() <= 0) heartbeat_interval_ = kRegisterRetryInterval;
  lease_ = response.lease_ms() > 0 ? std::chrono::milliseconds(response.lease_ms()) : coordinator::kDefaultNodeLease;
  spdlog::info("node {} registered at {} (heartbeat every {} ms)", node_id_, address_,
               heartbeat_interval_.count());
  return ok_status();
}

void DaemonServer::fence_tasks() {
  // A launch under way is not among the running jobs yet: it stops its tasks once they started.
  for (const auto& [job_id, attempt] : agent_service_->stop_launches_in_progress()) {
    spdlog::warn("node {}: its lease was not renewed; job {} attempt {}, being launched, stops once started "
                 "(fencing)",
                 node_id_, job_id, attempt);
    fenced_.insert({job_id, attempt});
  }
  std::vector<std::string> jobs = supervisor_->running_jobs();
  if (jobs.empty()) return;
  spdlog::warn("node {}: its lease ({} ms) was not renewed; stopping the tasks of {} job(s) before registering "
               "again (fencing)",
               node_id_, lease_.count(), jobs.size());
  for (const std::string& job_id : jobs) {
    if (std::optional<int> attempt = agent_service_->attempt_of(job_id)) fenced_.insert({job_id, *attempt});
    Status stopped = supervisor_->stop(job_id);
    if (!stopped.ok()) spdlog::error("fencing job {} on node {}: {}", job_id, node_id_, stopped.to_string());
  }
}

Status DaemonServer::heartbeat() {
  cohort::v1::HeartbeatRequest request;
  request.set_node_id(node_id_);
  request.set_unschedulable(draining_);
  // What runs here now: the coordinator answers with stops for what it no longer runs here (the
  // backstop for a StopTasks that never arrived). Each attempt's launch is kept, so that a stop acts
  // only on the tasks reported, never on a launch that began after this list was made.
  std::map<std::pair<std::string, int>, uint64_t> reported;
  request.set_running_reported(true);
  for (const AgentService::RunningLaunch& launch : agent_service_->running_launches()) {
    cohort::v1::RunningAttempt* running = request.add_running();
    running->set_job_id(launch.job_id);
    running->set_attempt(launch.attempt);
    for (int rank : launch.ranks) running->add_ranks(rank);
    reported[{launch.job_id, launch.attempt}] = launch.launch;
  }
  cohort::v1::HeartbeatResponse response;
  // Safe to send twice, so a leader that holds it without answering (stopped, cut off) costs only
  // its share of the deadline and the channel moves on to the coordinator that took over; waiting
  // out the whole deadline there would run down the lease and fence every task here. (A repeated
  // heartbeat judges the same list again and gives the same stops.)
  const grpc::Status beat = coordinator_leader_->idempotent_unary<cohort::v1::Coordinator>(
      std::chrono::system_clock::now() + options_.peer_rpc_timeout, &cohort::v1::Coordinator::Stub::Heartbeat, request,
      &response);
  COHORT_RETURN_IF_ERROR(from_grpc_status(beat, "Coordinator.Heartbeat", coordinator_leader_->leader_address()));
  for (const cohort::v1::HeartbeatStop& stop : response.stops()) {
    auto it = reported.find({stop.job_id(), stop.attempt()});
    if (it == reported.end()) {
      spdlog::warn("node {}: the coordinator's heartbeat reply orders job {} attempt {} stopped, which this "
                   "heartbeat did not report; ignored",
                   node_id_, stop.job_id(), stop.attempt());
      continue;
    }
    stop_on_heartbeat_reply(stop.job_id(), stop.attempt(), it->second, stop.reason());
  }
  return ok_status();
}

void DaemonServer::stop_on_heartbeat_reply(const std::string& job_id, int attempt, uint64_t launch,
                                           const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;  // the supervisor's destructor stops everything
  for (auto it = reply_stops_.begin(); it != reply_stops_.end();) {
    it = it->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready ? reply_stops_.erase(it)
                                                                                    : std::next(it);
  }
  // One under way waits out the stop grace period; later heartbeats order the same stop again.
  std::future<void>& stopping = reply_stops_[{job_id, attempt}];
  if (stopping.valid()) return;
  try {
    stopping = std::async(std::launch::async, [this, job_id, attempt, launch, reason] {
      StatusOr<int> stopped = agent_service_->stop_reported(job_id, attempt, launch, reason);
      if (!stopped.ok()) {
        spdlog::warn("node {}: stopping job {} attempt {} as the coordinator's heartbeat reply ordered failed: {}",
                     node_id_, job_id, attempt, stopped.status().to_string());
      }
    });
  } catch (const std::system_error& error) {
    // No thread could be made (the process or user thread limit, memory): uncaught, this would end
    // the daemon, and every task with it. The reply to the next heartbeat orders the stop again.
    reply_stops_.erase({job_id, attempt});
    spdlog::warn("node {}: could not start a thread to stop job {} attempt {} as the coordinator's heartbeat "
                 "reply ordered ({}); the next heartbeat's reply orders it again",
                 node_id_, job_id, attempt, error.what());
  }
}

std::string DaemonServer::fenced_detail() const {
  return fmt::format("stopped by node {}'s agent, which could not renew its lease for {} ms (fencing)", node_id_,
                     lease_.count());
}

Status DaemonServer::report_exit(const agent::TaskExit& exit) {
  std::optional<int> attempt = agent_service_->attempt_of(exit.job_id);
  if (!attempt.has_value()) return not_found_error("job {} was never launched here", exit.job_id);
  cohort::v1::ReportTaskExitRequest request;
  request.set_node_id(node_id_);
  request.set_job_id(exit.job_id);
  request.set_attempt(*attempt);
  request.set_rank(exit.rank);
  request.set_exit_code(exit.status.exit_code);
  request.set_signal(exit.status.signal);
  request.set_detail(exit.detail);
  if (exit.detail.empty() && fenced_.count({exit.job_id, *attempt}) != 0) request.set_detail(fenced_detail());
  cohort::v1::ReportTaskExitResponse response;
  const grpc::Status reported = coordinator_leader_->idempotent_unary<cohort::v1::Coordinator>(
      std::chrono::system_clock::now() + options_.peer_rpc_timeout, &cohort::v1::Coordinator::Stub::ReportTaskExit,
      request, &response);
  return from_grpc_status(reported, "Coordinator.ReportTaskExit", coordinator_leader_->leader_address());
}

void DaemonServer::tick_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    tick_healthy_until_ns_ = healthy_deadline_ns(options_.tick_interval);
    if (stop_changed_.wait_for(lock, options_.tick_interval, [this] { return stopping_; })) break;
    lock.unlock();
    // A coordinator that lost its leadership stops acting at once: no placements, no expiries.
    if (gate_->leading()) {
      dispatch(coordinator_->tick());
      publish_store_health();
      compact_etcd();
    }
    lock.lock();
  }
}

void DaemonServer::compact_etcd() {
  if (compactor_ == nullptr) return;
  Status compacted = compactor_->tick(std::chrono::steady_clock::now());
  if (!compacted.ok()) spdlog::warn("cohortd at {}: {}", advertised_address(), compacted.to_string());
}

void DaemonServer::publish_store_health() {
  const Status store = coordinator_->store_status();
  if (store.ok() == store_writable_) return;
  store_writable_ = store.ok();
  Status published = health_->set_serving(kCoordinatorService, store_writable_);
  if (!published.ok()) spdlog::warn("health of {}: {}", kCoordinatorService, published.to_string());
}

void DaemonServer::drain() {
  std::call_once(drain_once_, [this] {
    if (health_ != nullptr) health_->set_draining();
    if (coordinator_ != nullptr) coordinator_->start_draining();
    if (agent_service_ == nullptr || supervisor_ == nullptr) return;
    agent_service_->start_draining();
    // Tell the coordinator now, not at the next heartbeat, so no new job is placed here (the
    // agent thread heartbeats concurrently; both calls carry the same flag).
    draining_ = true;
    Status told = heartbeat();
    if (!told.ok()) spdlog::warn("draining: telling the coordinator failed: {}", told.to_string());
    // One thread per job: each stop may take the whole grace period, and they must overlap.
    std::vector<std::thread> stoppers;
    for (const std::string& job_id : supervisor_->running_jobs()) {
      spdlog::info("draining: stopping job {} on node {}", job_id, node_id_);
      stoppers.emplace_back([this, job_id] {
        Status stopped = supervisor_->stop(job_id);
        if (!stopped.ok()) spdlog::warn("draining: stopping job {}: {}", job_id, stopped.to_string());
      });
    }
    for (std::thread& stopper : stoppers) stopper.join();
    // The stopped tasks' exits are queued for the coordinator; shutdown() ends the agent thread,
    // so let it send them first (bounded: a coordinator that is gone gets one RPC timeout).
    std::unique_lock<std::mutex> lock(mu_);
    exits_reported_.wait_for(lock, options_.peer_rpc_timeout,
                             [this] { return stopping_ || (exits_queue_.empty() && exits_in_flight_ == 0); });
  });
}

void DaemonServer::shutdown() {
  // call_once: a second caller (the destructor after an explicit shutdown, a signal thread) waits
  // for the first to finish instead of racing it.
  std::call_once(shutdown_once_, [this] { shutdown_once(); });
}

void DaemonServer::shutdown_once() {
  shutting_down_ = true;
  // A become_leader() under way finishes first (its threads are then joined below); later ones see
  // shutting_down_ and refuse.
  { std::lock_guard<std::mutex> leadership(leadership_mu_); }
  // A leader resigns, so a standby takes over at once instead of after the lease's TTL.
  if (election_ != nullptr) election_->stop();
  // First: its pages read the coordinator, which stops below.
  if (http_server_ != nullptr) http_server_->stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_changed_.notify_all();
  orders_changed_.notify_all();
  exits_changed_.notify_all();
  // Load balancers and `grpc_health_probe` see the drain before calls start failing.
  if (health_ != nullptr) health_->set_draining();
  if (tick_thread_.joinable()) tick_thread_.join();
  if (dispatch_thread_.joinable()) dispatch_thread_.join();
  if (agent_thread_.joinable()) agent_thread_.join();
  // Heartbeat replies' stops under way finish (each within the stop grace period) before the
  // supervisor goes; stopping_ keeps new ones from starting.
  std::map<std::pair<std::string, int>, std::future<void>> reply_stops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reply_stops.swap(reply_stops_);
  }
  reply_stops.clear();
  // Wakes WatchJob streams and rendezvous waiters with UNAVAILABLE, so the drain below is quick.
  {
    std::lock_guard<std::mutex> leadership(leadership_mu_);
    if (coordinator_ != nullptr) coordinator_->shutdown();
  }
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + options_.shutdown_grace);
    server_->Wait();
  }
  // Last: its destructor stops the tasks still running (their exits are no longer reported).
  supervisor_.reset();
}

StatusOr<std::unique_ptr<etcd::EtcdClient>> DaemonServer::etcd_client(const std::string& url) const {
  etcd::EtcdOptions etcd_options;
  COHORT_ASSIGN_OR_RETURN(etcd_options.endpoints, etcd::parse_etcd_url(url));
  // TLS to etcd: its CA, and this coordinator's client certificate (etcd --client-cert-auth).
  for (auto [path, pem] : {std::pair{&options_.etcd_ca_file, &etcd_options.ca_pem},
                           std::pair{&options_.etcd_cert_file, &etcd_options.certificate_pem},
                           std::pair{&options_.etcd_key_file, &etcd_options.key_pem}}) {
    if (path->empty()) continue;
    COHORT_ASSIGN_OR_RETURN(*pem, security::read_file(*path));
  }
  return etcd::EtcdClient::create(etcd_options);
}

Status DaemonServer::start_election() {
  COHORT_ASSIGN_OR_RETURN(etcd_, etcd_client(options_.election));
  etcd::LeaderElectionOptions election;
  election.name = options_.election_name;
  election.value = advertised_address();
  election.lease_ttl = options_.leader_lease_ttl;
  // The callbacks run on the election's threads.
  election.on_elected = [this](const etcd::LeaderKey& key) {
    spdlog::info("cohortd at {} won the election {} (revision {})", advertised_address(), key.name, key.rev);
    {
      std::lock_guard<std::mutex> leadership(leadership_mu_);
      leader_key_ = key;  // the job store's fencing token (etcd::EtcdJobStore::set_fence)
    }
    Status led = become_leader();
    if (!led.ok()) {
      spdlog::error("cohortd at {} was elected but cannot lead: {}", advertised_address(), led.to_string());
      if (options_.on_leadership_lost) options_.on_leadership_lost();
    }
  };
  election.on_lost = [this](const Status& why) {
    spdlog::warn("cohortd at {}: leadership lost: {}", advertised_address(), why.to_string());
    // After a become_leader() under way (on the campaign thread, loading the store): seen before it,
    // the loss would find nothing to step down and the gate would open after it, a leader whose
    // store writes fail (the fence is gone) taking heartbeats. become_leader() checks the election
    // before it leads; this steps down one that led.
    std::lock_guard<std::mutex> leadership(leadership_mu_);
    follow_leader("");
  };
  election.on_leader_changed = [this](const std::string& leader) {
    if (!leading()) follow_leader(leader);
  };
  election_ = std::make_unique<etcd::LeaderElection>(etcd_.get(), election);
  spdlog::info("cohortd at {} campaigns for leadership in etcd ({}, election {}, lease {} s)", advertised_address(),
               options_.election, options_.election_name, options_.leader_lease_ttl.count());
  return election_->start();
}

Status DaemonServer::open_coordinator() {
  coordinator::CoordinatorOptions coordinator_options;
  coordinator_options.data_dir = options_.data_dir;
  coordinator_options.node_lease = options_.node_lease;
  coordinator_options.allowed_path_roots = options_.allowed_path_roots;
  coordinator_options.allowed_commands = options_.allowed_commands;
  if (!options_.job_store.empty()) {
    // The jobs in etcd (issue 16): whichever coordinator leads loads the same ones. With an
    // election, every write is fenced on the key this coordinator won (leader_key_).
    if (store_etcd_ == nullptr) {
      COHORT_ASSIGN_OR_RETURN(store_etcd_, etcd_client(options_.job_store));
    }
    coordinator_options.open_store = [this]() -> StatusOr<std::unique_ptr<coordinator::JobStore>> {
      COHORT_ASSIGN_OR_RETURN(std::unique_ptr<etcd::EtcdJobStore> store, etcd::EtcdJobStore::open(store_etcd_.get()));
      store->set_fence(leader_key_);
      return std::unique_ptr<coordinator::JobStore>(std::move(store));
    };
  }
  coordinator_options.job_retention = options_.job_retention;
  coordinator_options.start_timeout = options_.start_timeout;
  COHORT_ASSIGN_OR_RETURN(coordinator_, coordinator::Coordinator::open(coordinator_options, &clock_));
  coordinator_service_ = std::make_unique<CoordinatorService>(
      coordinator_.get(), &clock_, security_.get(),
      [this](coordinator::AgentOrders orders) { dispatch(std::move(orders)); });
  // Heartbeat stops come only from a leader (issue 16): the gate refuses standbys, and this catches a
  // heartbeat during which the leadership was lost.
  coordinator_service_->set_leading([this] { return gate_->leading(); });
  rendezvous_service_ = std::make_unique<RendezvousService>(coordinator_.get(), security_.get());
  metrics_->add_collectable(std::make_shared<metrics::CoordinatorCollector>(coordinator_.get(), &clock_));
  return ok_status();
}

Status DaemonServer::follow_identities() {
  coordinator::IdentityStore* identities = security_->identities();
  if (!options_.job_store.empty() && identities != nullptr) {
    // store_etcd_ is open (open_coordinator); the records sit beside the jobs, under the same prefix.
    auto journal = std::make_shared<etcd::EtcdIdentityJournal>(store_etcd_.get(), etcd::kDefaultStorePrefix,
                                                               leader_key_);
    const std::string where = journal->description();
    COHORT_ASSIGN_OR_RETURN(coordinator::IdentityStore::JournalSync sync,
                            identities->follow_journal(journal));
    spdlog::info("identities {} {}: {} users, {} unused join tokens, {} node certificates",
                 sync.seeded ? "uploaded to" : "loaded from", where, sync.users, sync.join_tokens,
                 sync.certificates);
  }
  return security_->write_first_admin_credentials(address_);
}

void DaemonServer::start_leading_threads() {
  tick_healthy_until_ns_ = healthy_deadline_ns(options_.tick_interval);
  tick_thread_ = std::thread([this] { tick_loop(); });
  dispatch_thread_ = std::thread([this] { dispatch_loop(); });
  leading_threads_ = true;
  gate_->lead(coordinator_service_.get(), rendezvous_service_.get());
  for (const char* service : {kCoordinatorService, kRendezvousService}) {
    Status serving = health_->set_serving(service, true);
    if (!serving.ok()) spdlog::warn("health of {}: {}", service, serving.to_string());
  }
}

std::string DaemonServer::advertised_address() const {
  return options_.advertise_address.empty() ? address_ : options_.advertise_address;
}

Status DaemonServer::become_leader() {
  if (!has_coordinator()) return failed_precondition_error("cohortd at {} runs no coordinator", address_);
  std::lock_guard<std::mutex> leadership(leadership_mu_);
  if (shutting_down_) return unavailable_error("cohortd at {} is shutting down", advertised_address());
  if (gate_->leading()) return ok_status();
  if (coordinator_ != nullptr) {
    // Led before and lost it: its in-memory state is stale, and reloading it in place would race
    // the calls still in flight. cohortd exits on a lost leadership (a restart comes back a standby).
    return failed_precondition_error(
        "cohortd at {} lost its leadership earlier; restart it to stand for election again", advertised_address());
  }
  const auto started = std::chrono::steady_clock::now();
  // Loads every job from the store; attempts that were running wait one reconcile window (a node
  // lease) for their agents to re-register and report them, as after a coordinator restart.
  COHORT_RETURN_IF_ERROR(open_coordinator());
  coordinator_service_->set_address(advertised_address());
  COHORT_RETURN_IF_ERROR(follow_identities());
  if (store_etcd_ != nullptr && options_.etcd_compaction_interval.count() > 0) {
    compactor_ = std::make_unique<etcd::EtcdCompactor>(store_etcd_.get(), options_.etcd_compaction_interval);
  }
  if (options_.before_leading) options_.before_leading();
  // The election may have been lost while the store loaded (on_lost waits for leadership_mu_, so a
  // loss from here on steps this leader down): leading on a lost key would take heartbeats and
  // placements with every store write failing on its dead fence, and nothing would step it down.
  if (election_ != nullptr) {
    const std::optional<etcd::LeaderKey> now = election_->leadership();
    if (!now.has_value() || !leader_key_.has_value() || now->key != leader_key_->key ||
        now->rev != leader_key_->rev) {
      return unavailable_error(
          "cohortd at {} lost the election {} (key {}) while loading the store; it does not lead (restart it to "
          "stand for election again)",
          advertised_address(), options_.election_name, leader_key_.has_value() ? leader_key_->key : "none");
    }
  }
  start_leading_threads();
  spdlog::info("cohortd at {} leads the cluster now (store loaded in {} ms)", advertised_address(),
               std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started)
                   .count());
  return ok_status();
}

void DaemonServer::follow_leader(const std::string& leader) {
  if (!has_coordinator()) return;
  const bool was_leading = gate_->leading();
  gate_->follow(leader);
  if (was_leading) {
    for (const char* service : {kCoordinatorService, kRendezvousService}) {
      Status standby = health_->set_serving(service, false);
      if (!standby.ok()) spdlog::warn("health of {}: {}", service, standby.to_string());
    }
    if (shutting_down_) return;  // a leader resigning as it stops: nothing was lost
    spdlog::error("cohortd at {} lost its leadership (the leader is now {}); it no longer acts as coordinator",
                  advertised_address(), leader.empty() ? "not known" : leader);
    if (options_.on_leadership_lost) options_.on_leadership_lost();
  }
}

bool DaemonServer::leading() const { return gate_ != nullptr && gate_->leading(); }

}  // namespace cohort::daemon
