#pragma once

// DaemonServer: cohortd's gRPC server, for the coordinator role, the agent role, or both ("all").
//
// Coordinator role: opens the Coordinator on the data directory, serves cohort.v1.Coordinator and
// Rendezvous, runs the coordinator's periodic tick (node leases, placement) on its own thread, and
// carries out the AgentOrders it produces on a dispatch thread: Agent.LaunchTasks (then the
// coordinator's report_tasks_started, or report_launch_failure when the agent could not start the
// tasks, which fails the attempt) and Agent.StopTasks, each call with a deadline. Each attempt gets
// one MASTER_PORT, picked free on this host, for all of its nodes.
//
// Agent role: runs a TaskSupervisor behind cohort.v1.Agent, registers the node with the
// coordinator (RegisterNode with its address and inventory), heartbeats every
// heartbeat_interval_ms the coordinator asks for (lease / 3), registers again when a heartbeat
// answers NOT_FOUND (the coordinator restarted or declared the node lost), and reports each task
// exit (ReportTaskExit). The supervisor's exit callback only queues the exit; the agent thread
// sends it, so no RPC runs inside the callback. RegisterNode lists the attempts the node still
// runs, so the coordinator keeps what it owns and stops the rest; so does every heartbeat, whose
// reply's stops the agent carries out (the backstop for a StopTasks that never arrived). An agent
// that could not renew its lease for a whole lease stops all its tasks first (fencing, issue 16).
//
// Every role serves cohort.v1.Info, grpc.health.v1 with a status per service (health_state.h) and
// gRPC server reflection (grpc.reflection.v1alpha, to any authenticated caller).
//
//   DaemonServerOptions options;
//   options.listen = "127.0.0.1:0";          // port 0: the kernel picks; port() tells which
//   options.data_dir = "/var/lib/cohort";
//   COHORT_ASSIGN_OR_RETURN(auto server, DaemonServer::start(options));
//   std::printf("listening on %s\n", server->address().c_str());
//   ...
//   server->drain();                         // SIGTERM: refuse new work, stop this node's tasks
//   server->shutdown();                      // NOT_SERVING, stop ticking, drain with a deadline
//
//   options.role = DaemonRole::kAll;         // coordinator and agent in one process
//   options.slots = 2;
//
// Orders for agents go to DaemonServerOptions::orders when it is set (tests), else to the agents'
// Agent services as above.
//
// Thread-safe: shutdown() may be called from any thread, more than once.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "cohort/v1/agent.grpc.pb.h"
#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/agent/process_launcher.h"
#include "daemon/agent/task_supervisor.h"
#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/coordinator.h"
#include "daemon/etcd/etcd_client.h"
#include "daemon/etcd/etcd_compactor.h"
#include "daemon/etcd/etcd_identity_journal.h"
#include "daemon/etcd/etcd_job_store.h"
#include "daemon/etcd/leader_election.h"
#include "daemon/http/http_server.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/security/daemon_security.h"
#include "daemon/server/health_state.h"
#include "daemon/service/agent_service.h"
#include "daemon/service/coordinator_service.h"
#include "daemon/service/info_service.h"
#include "daemon/service/leader_gate.h"
#include "daemon/service/rendezvous_service.h"
#include "worker/base/leader_channel.h"
#include "worker/base/status.h"

namespace cohort::daemon {

// How often the coordinator expires leases and places queued jobs (also done after each submit).
inline constexpr std::chrono::milliseconds kDefaultTickInterval = std::chrono::seconds(1);
// How long shutdown lets in-flight calls finish before cancelling them.
inline constexpr std::chrono::milliseconds kDefaultShutdownGrace = std::chrono::seconds(5);
// Where cohortd listens unless told otherwise (the CLI's default coordinator address).
inline constexpr const char* kDefaultListenAddress = "127.0.0.1:7070";

// How long one call to an agent or to the coordinator (launch, register, heartbeat, exit report)
// may take; a dead peer must turn into a logged error, not a stuck dispatch or agent thread.
inline constexpr std::chrono::milliseconds kDefaultPeerRpcTimeout = std::chrono::seconds(10);
// How long an agent waits before trying RegisterNode (or a failed exit report) again.
inline constexpr std::chrono::milliseconds kRegisterRetryInterval = std::chrono::seconds(1);
// A stop order the agent did not take (no answer, a TLS handshake failing under load) is sent
// again after this, doubling each time up to kMaxStopRetryInterval, until the agent takes it (an
// agent that holds nothing of the job answers NOT_FOUND, which counts as taken), its node is gone
// (lost, removed, or registered again at another address: the registration then reconciles what it
// runs), or it was sent kMaxStopTries times. Without it the tasks of a cancelled or failed attempt
// run on, holding their slots.
inline constexpr std::chrono::milliseconds kStopRetryInterval = std::chrono::seconds(1);
inline constexpr std::chrono::milliseconds kMaxStopRetryInterval = std::chrono::seconds(30);
// Sends of one stop order at most (the first and its retries), then it is dropped with an error.
// These retries are the fast path; the node's heartbeats are the backstop: each reports what the
// agent runs, and the coordinator's reply orders stopped what it no longer runs there
// (Coordinator::heartbeat), so an agent that answered UNAVAILABLE longer than the retries lasted,
// or was cut off for a while, stops the tasks at its first heartbeat that gets through (every
// lease / kHeartbeatsPerLease) while its node stays registered. A node that stays unreachable
// loses its lease and its agent stops its tasks itself (fencing); when it registers again, the
// registration's orders stop the attempts that are over. (An agent older than the heartbeat's
// report gets only those two.) Retrying for ever instead would hold the single dispatch thread
// once per retry, delaying every launch.
inline constexpr int kMaxStopTries = 3;
// The shortest interval between client keepalive pings the server accepts without data flowing;
// below the CLI's 30 s keepalive (client/client.h), so its idle streams are not cut.
inline constexpr std::chrono::milliseconds kMinClientPingInterval = std::chrono::seconds(10);
// How long the tick and agent loops may go without finishing an iteration before healthy() says
// no (the systemd watchdog then stops pinging): well above an iteration's worst case (a few peer
// RPC timeouts), so a slow coordinator is not mistaken for a hung daemon.
inline constexpr std::chrono::milliseconds kDefaultMaxLoopSilence = std::chrono::seconds(60);
// The worker every task runs unless DaemonServerOptions::worker_command says otherwise.
inline constexpr const char* kDefaultWorkerPath = "/usr/local/bin/cohort-worker";

// The services whose health set_serving() sets (grpc.health.v1 names them so).
inline constexpr const char* kCoordinatorService = "cohort.v1.Coordinator";
inline constexpr const char* kRendezvousService = "cohort.v1.Rendezvous";
inline constexpr const char* kAgentService = "cohort.v1.Agent";
inline constexpr const char* kInfoService = "cohort.v1.Info";

enum class DaemonRole {
  kCoordinator,  // node registry, scheduling, rendezvous, job records
  kAgent,        // runs this node's tasks for a coordinator elsewhere
  kAll,          // both in one process; the agent registers with its own coordinator
};

// "coordinator" | "agent" | "all"; INVALID_ARGUMENT naming the value otherwise.
StatusOr<DaemonRole> parse_daemon_role(const std::string& role);

struct DaemonServerOptions {
  DaemonRole role = DaemonRole::kCoordinator;                         // which services this daemon runs
  std::string listen = kDefaultListenAddress;                         // HOST:PORT; port 0 picks a free one
  std::string data_dir;                                               // job database directory (required)
  std::chrono::milliseconds tick_interval = kDefaultTickInterval;     // coordinator tick period
  std::chrono::milliseconds shutdown_grace = kDefaultShutdownGrace;   // drain limit for in-flight calls
  coordinator::Duration node_lease = coordinator::kDefaultNodeLease;  // a node silent this long is lost
  OrdersHandler orders;  // receives agent orders; empty: sent to the agents' Agent services
  // Agent role (kAgent, kAll):
  std::string coordinator_address;  // HOST:PORT to register with; empty with kAll: this server
  std::string node_id;              // registry id; empty: this machine's host name
  int slots = 1;                    // tasks this node runs at once (>= 1)
  std::string log_dir;              // rank logs; empty: <data_dir>/logs
  // argv of every task (argv[0] absolute); the task learns its job from COHORT_JOB_ID, RANK, ...
  // Tests set a shell command here, since JobSpec has no field for the worker binary.
  std::vector<std::string> worker_command = {kDefaultWorkerPath};
  agent::Duration stop_grace_period = agent::kDefaultStopGracePeriod;   // SIGTERM → SIGKILL
  // Rank logs of one job attempt on this node, on disk, all ranks together (rotated); 0: no cap.
  uint64_t max_log_bytes_per_job = agent::kDefaultMaxLogBytesPerJob;
  // A finished job's records (coordinator: job row, events, metrics history) and its rank logs
  // (agent: the job's log directory, counted from the last write there) are deleted this long after
  // it ended (daemon config job_retention).
  std::chrono::milliseconds job_retention = coordinator::kDefaultJobRetention;
  // Hang detection (task_supervisor.h): a rank stopped, or silent after a heartbeat, this long is killed.
  agent::Duration stopped_task_limit = agent::kDefaultStoppedTaskLimit;
  agent::Duration task_heartbeat_timeout = agent::kDefaultHeartbeatTimeout;
  agent::Duration task_heartbeat_interval = kDefaultRankHeartbeatInterval;  // asked of every rank
  std::chrono::milliseconds peer_rpc_timeout = kDefaultPeerRpcTimeout;  // one call to a peer
  // Coordinator: how long a placed attempt's nodes have to report its tasks started before it fails
  // naming them (daemon config start_timeout_ms; CoordinatorOptions::start_timeout).
  coordinator::Duration start_timeout = coordinator::kDefaultStartTimeout;
  // Agent: how long one task may take from fork to exec (its chdir and execve, which a hung mount
  // blocks) before its launch fails (daemon config exec_timeout_ms; agent::LaunchOptions). The
  // drain waits as long for launches under way.
  std::chrono::milliseconds exec_timeout = agent::kDefaultExecTimeout;
  std::chrono::milliseconds max_loop_silence = kDefaultMaxLoopSilence;  // see healthy()
  // Jobs (agent roles): who the ranks run as, and where spec paths may point.
  std::string job_user = "cohort-job";          // Unix user for owners without a user_map entry
  std::map<std::string, std::string> user_map;  // cohort user -> Unix user
  // false: job_user serves one owner per node (the first; <data_dir>/job_user.holder), others are
  // refused until mapped; true: owners without a user_map entry share it (and each other's jobs).
  bool shared_job_user = false;
  // A daemon not running as root runs jobs (as its own uid, which owns data_dir's CA key and admin
  // credentials) only when this is set: every cohort user may act as the operator (`cohort run`).
  bool run_jobs_as_daemon_user = false;
  // Roots (besides each job's own directory) for checkpoint.dir, dataset.path, torchscript_file.
  std::vector<std::string> allowed_path_roots = {"/usr/share/datasets"};
  // Executables command jobs may run (absolute paths); empty: any. Checked at submit by the
  // coordinator and again at launch by each agent.
  std::vector<std::string> allowed_commands;
  // High availability (issue 16; coordinator roles): start as a standby that opens no Coordinator
  // and answers UNAVAILABLE naming `standby_leader` until become_leader(); the election
  // (LeaderElection over etcd) calls become_leader() / follow_leader().
  // election: the etcd cluster the coordinators elect their leader in ("etcd://h1:2379,h2:2379");
  // set, this coordinator starts as a standby and campaigns (value: advertise_address). The etcd_*
  // files are PEM: the etcd cluster's CA and this daemon's client certificate and key.
  std::string election;
  // job_store: where the coordinator keeps its jobs: empty, SQLite in data_dir; "etcd://h1:2379,..."
  // an etcd cluster (daemon/etcd/etcd_job_store.h, TLS with the etcd_* files), so that whichever
  // coordinator leads reads the same jobs; with an election its writes are fenced on the key won.
  std::string job_store;
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
  std::string election_name = etcd::kDefaultElectionName;                 // the election's key prefix
  // With an etcd job store, the leader compacts etcd's history this often, keeping one to two
  // intervals of it (etcd_compactor.h); 0: never (etcd compacts itself: --auto-compaction-retention).
  std::chrono::milliseconds etcd_compaction_interval = etcd::kDefaultCompactionInterval;
  std::chrono::seconds leader_lease_ttl = etcd::kDefaultLeaderLeaseTtl;  // a dead leader is replaced within
  bool standby = false;
  std::string standby_leader;     // the leader a standby names at first; empty: not known
  std::string advertise_address;  // HOST:PORT clients reach this coordinator at; empty: address()
  // Called (on the election's thread) when a leading coordinator loses its leadership; cohortd's
  // main then exits with status 1 so its supervisor restarts it as a standby.
  std::function<void()> on_leadership_lost;
  // Tests: runs in become_leader() once the store is loaded, before the coordinator leads (the
  // election's thread, under the leadership lock), so a test can lose the election in between.
  std::function<void()> before_leading;
  // Security (see daemon/security/): plaintext only with insecure (loopback listen only).
  bool insecure = false;
  std::string join_token;        // agent role: joins the cluster with it on first start
  std::string credentials_file;  // agent role: written by the join (node key + certificate dir)
  // Observability (daemon/server/daemon_http.h): the HTTPS port serving /metrics; empty: none.
  std::string http_listen;      // HOST:PORT (port 0 picks a free one)
  std::string http_token_file;  // a scrape token accepted besides users' tokens (required on agents)
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
  // Only for the kCoordinator and kAll roles.
  coordinator::Coordinator& coordinator() { return *coordinator_; }
  // TLS, users, nodes and job secrets of this daemon; owned by the server.
  security::DaemonSecurity& security() { return *security_; }
  // The node id the agent registers as (kAgent, kAll); empty for kCoordinator.
  const std::string& node_id() const { return node_id_; }
  // The HTTPS port bound (http_listen), 0 when it is off.
  int http_port() const { return http_server_ == nullptr ? 0 : http_server_->port(); }
  // What /metrics shows; owned by the server.
  metrics::DaemonMetrics& metrics() { return *metrics_; }

  // Health per service (grpc.health.v1, health_state.h): whether `service` (a full name this daemon
  // serves: kCoordinatorService, kAgentService, ...) may serve. A standby coordinator or one whose
  // job store is down sets kCoordinatorService false, and true again when it can serve; a drain
  // overrides both. NOT_FOUND for a service this daemon does not serve. Thread-safe, non-blocking.
  Status set_serving(const std::string& service, bool serving) { return health_->set_serving(service, serving); }
  // What grpc.health.v1 answers now, per service ("" for the whole daemon).
  const HealthState& health() const { return *health_; }

  // High availability (issue 16). become_leader: this coordinator won the election: it opens the
  // Coordinator on the shared store (every job loaded; running attempts wait one node lease for
  // their agents to re-register and report them, as after a restart), starts placing, and its
  // services answer from now on. With `job_store: etcd://` the identities follow the leader too:
  // the users, join tokens and node certificates in etcd replace the local identity.db (the first
  // leader of a new cluster uploads its own instead), every later change is written to etcd, and
  // the first admin is made here, once the cluster's identities are known. A standby authenticates
  // from its local identity.db alone (a cache, possibly stale: it serves no Coordinator or
  // Rendezvous call anyway, and a caller it does not know gets UNAVAILABLE naming the leader).
  // Blocks on the store. FAILED_PRECONDITION for a daemon that led
  // before (restart it instead). follow_leader: another coordinator leads (`leader`, empty when
  // unknown): calls are refused naming it, health turns NOT_SERVING; a leader losing its leadership
  // stops ticking and dispatching at once and calls options.on_leadership_lost. Thread-safe.
  Status become_leader();
  void follow_leader(const std::string& leader);
  // Whether this coordinator leads now (false on an agent).
  bool leading() const;
  // HOST:PORT this coordinator is reached at (options.advertise_address, else address()).
  std::string advertised_address() const;

  // The first half of a graceful stop (SIGTERM): health turns NOT_SERVING, SubmitJob and
  // LaunchTasks answer UNAVAILABLE "draining", and this node's running tasks are stopped (SIGTERM,
  // SIGKILL after options.stop_grace_period) with their exits still reported, so their jobs end
  // with a reason. The server keeps answering everything else until shutdown(). Blocks up to
  // about the grace period; idempotent.
  void drain();

  // Whether the daemon's own loops (the coordinator's tick, the agent's register / heartbeat /
  // exit-report loop) are each waiting as planned or finished their work within
  // options.max_loop_silence; true once shutting down. For the systemd watchdog. Thread-safe,
  // non-blocking.
  bool healthy() const;

  // Marks health NOT_SERVING, stops the tick thread, shuts the coordinator down (waking every
  // watcher and rendezvous waiter), and stops the server, cancelling calls still running after
  // options.shutdown_grace. Idempotent: concurrent and later calls wait for the first to finish.
  // Blocks up to about shutdown_grace.
  void shutdown();

 private:
  explicit DaemonServer(DaemonServerOptions options);
  void shutdown_once();
  void tick_loop();
  // kCoordinatorService's health follows the job store (issue 16): NOT_SERVING while its writes
  // fail, SERVING once a retried write succeeds; only changes are published. Tick thread only.
  void publish_store_health();
  // The leader's periodic compaction of etcd's history (compactor_); tick thread.
  void compact_etcd();
  // Connects to options_.election and campaigns; the callbacks call become_leader / follow_leader.
  Status start_election();
  // The client of an etcd cluster ("etcd://...") with the etcd_* TLS files.
  StatusOr<std::unique_ptr<etcd::EtcdClient>> etcd_client(const std::string& url) const;
  // Opens the Coordinator and its services (not yet serving: the gate opens in start_leading_threads).
  Status open_coordinator();
  // With an etcd job store: makes the identities follow etcd (fenced on leader_key_), and makes the
  // first admin if the cluster has none yet (a new cluster's first leader). Before the gate opens.
  Status follow_identities();
  // Starts the tick and dispatch threads and opens the leadership gate.
  void start_leading_threads();
  // Now + `idle` + options_.max_loop_silence, in steady_clock nanoseconds.
  int64_t healthy_deadline_ns(std::chrono::milliseconds idle) const;
  void dispatch(coordinator::AgentOrders orders);
  // Coordinator side: carries out queued orders with Agent stubs.
  void dispatch_loop();
  void send_launch(const coordinator::LaunchOrder& order);
  // Whether the coordinator still runs `attempt` of `job_id` (PLACED or RUNNING).
  bool attempt_is_active(const std::string& job_id, int attempt) const;
  // The MASTER_PORT of the order's attempt (picked free on this host the first time).
  int master_port_for(const coordinator::LaunchOrder& order);
  // Sends one StopTasks; when the agent does not take it, queues it in stop_retries_ (see
  // kStopRetryInterval, kMaxStopTries). `failures`: how many times this order failed before.
  void send_stop(const coordinator::StopOrder& order, int failures = 0);
  // Sends the stop orders in stop_retries_ that are due, dropping those whose node is gone; none
  // once shutdown began. Dispatch thread only.
  void retry_stops();
  // The Agent stub for the node `node_id` at `address` (mutual TLS with the coordinator's certificate).
  cohort::v1::Agent::Stub& agent_stub(const std::string& address, const std::string& node_id);
  // Agent side: register, heartbeat, report exits.
  void start_agent();
  void agent_loop();
  Status register_node();
  Status heartbeat();
  // Carries out, on a thread of its own (it blocks up to the stop grace period), a stop the
  // coordinator's heartbeat reply ordered for an attempt that heartbeat reported from launch
  // `launch` (AgentService::stop_reported); nothing when one for the attempt is still under way.
  void stop_on_heartbeat_reply(const std::string& job_id, int attempt, uint64_t launch, const std::string& reason);
  Status report_exit(const agent::TaskExit& exit);
  // What an exit report says of a task this agent stopped because its lease ran out (fencing).
  std::string fenced_detail() const;
  // Stops every running task of this node (the lease ran out: fencing). Blocks up to the grace period.
  void fence_tasks();
  bool has_coordinator() const { return options_.role != DaemonRole::kAgent; }
  bool has_agent() const { return options_.role != DaemonRole::kCoordinator; }

  const DaemonServerOptions options_;
  coordinator::SystemClock clock_;
  std::unique_ptr<security::DaemonSecurity> security_;
  std::unique_ptr<coordinator::Coordinator> coordinator_;
  std::unique_ptr<InfoService> info_service_;
  std::unique_ptr<CoordinatorService> coordinator_service_;
  std::unique_ptr<RendezvousService> rendezvous_service_;
  // Issue 16: the gated services registered with gRPC, and whether this coordinator leads.
  std::unique_ptr<LeaderGate> gate_;
  std::unique_ptr<GatedCoordinatorService> gated_coordinator_;
  std::unique_ptr<GatedRendezvousService> gated_rendezvous_;
  std::unique_ptr<etcd::EtcdClient> etcd_;         // options_.election's cluster
  std::unique_ptr<etcd::EtcdClient> store_etcd_;   // options_.job_store's cluster (opened when leading)
  std::unique_ptr<etcd::LeaderElection> election_;  // stopped first in shutdown (a leader resigns)
  // The leader's compaction of etcd's history (an etcd job store only); made by become_leader,
  // then tick thread only.
  std::unique_ptr<etcd::EtcdCompactor> compactor_;
  std::optional<etcd::LeaderKey> leader_key_;       // guarded by leadership_mu_; the election won
  std::mutex leadership_mu_;                   // become_leader against shutdown
  std::atomic<bool> leading_threads_{false};  // the tick and dispatch threads run
  agent::PosixProcessLauncher launcher_;
  std::unique_ptr<agent::TaskSupervisor> supervisor_;
  std::unique_ptr<AgentService> agent_service_;
  // The agent's coordinators (a list: the leader). Set before the agent thread starts and never
  // replaced (a renewal calls set_credentials): drain() uses it from another thread.
  std::unique_ptr<tls::LeaderChannel> coordinator_leader_;
  uint64_t node_certificate_generation_ = 0;  // agent thread; what coordinator_leader_ was built with
  std::string node_id_;
  std::chrono::milliseconds heartbeat_interval_ = kRegisterRetryInterval;  // agent thread only
  std::chrono::milliseconds lease_ = coordinator::kDefaultNodeLease;       // agent thread only; from the coordinator
  // When the lease was last renewed (register or heartbeat sent); nullopt before the first and
  // after a fence. Agent thread only.
  std::optional<std::chrono::steady_clock::time_point> last_renewal_;
  // Attempts this agent fenced (job id, attempt): their exit reports say so. Agent thread only.
  std::set<std::pair<std::string, int>> fenced_;
  std::unique_ptr<metrics::DaemonMetrics> metrics_;  // declared before server_: its interceptor uses it
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthState> health_;  // after server_: publishes into its health service
  bool store_writable_ = true;  // the job store's health as last published (tick thread)
  std::unique_ptr<http::HttpServer> http_server_;  // http_listen; stopped first in shutdown
  int port_ = 0;
  std::string address_;

  std::mutex mu_;
  std::condition_variable stop_changed_;  // wakes the tick thread for shutdown
  bool stopping_ = false;
  std::deque<coordinator::AgentOrders> orders_queue_;  // guarded by mu_; for the dispatch thread
  std::deque<agent::TaskExit> exits_queue_;            // guarded by mu_; for the agent thread
  std::condition_variable orders_changed_;             // wakes the dispatch thread
  std::condition_variable exits_changed_;              // wakes the agent thread
  int exits_in_flight_ = 0;                 // guarded by mu_; exits the agent thread is reporting now
  std::condition_variable exits_reported_;  // the agent thread finished a batch of exit reports
  std::map<std::string, std::unique_ptr<cohort::v1::Agent::Stub>> agent_stubs_;  // dispatch thread only
  // Stops ordered by heartbeat replies, being carried out, by (job id, attempt); guarded by mu_.
  std::map<std::pair<std::string, int>, std::future<void>> reply_stops_;
  // Stop orders an agent did not take, with when to send each again; dispatch thread only.
  struct PendingStop {
    coordinator::StopOrder order;
    int failures = 0;
    std::chrono::steady_clock::time_point due;
  };
  std::vector<PendingStop> stop_retries_;
  // MASTER_PORT of each attempt, chosen once so every node of it gets the same; dispatch thread only.
  std::map<std::pair<std::string, int>, int> master_ports_;
  std::once_flag drain_once_;
  std::once_flag shutdown_once_;
  // steady_clock nanoseconds until which the tick / agent loop counts as healthy: set before each
  // wait to the wait's end plus max_loop_silence for the work that follows.
  std::atomic<int64_t> tick_healthy_until_ns_{0};
  std::atomic<int64_t> agent_healthy_until_ns_{0};
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> draining_{false};  // the agent reports itself unschedulable
  std::thread tick_thread_;
  std::thread dispatch_thread_;
  std::thread agent_thread_;
};

}  // namespace cohort::daemon
