#pragma once

// Coordinator: the control plane's brain, as plain C++ that a unit test drives without a server.
// It composes the NodeRegistry (nodes and leases), the Scheduler (gang placement, FIFO), the
// JobStateMachine of each job (with its restart policy), one Rendezvous per placed attempt, and the
// JobStore (SQLite in the data directory, so a restart loses no job).
//
// It never talks to agents itself: calls that require agents to act return AgentOrders (launch
// these tasks, stop those) that the gRPC layer carries out, then reports back what happened
// (report_tasks_started, report_task_exit). Time comes from an injected Clock; tick() is the
// periodic step (expire nodes, place queued jobs) the server calls every second or so and after
// each submit.
//
//   SystemClock clock;
//   CoordinatorOptions options;
//   options.data_dir = "/var/lib/cohort";
//   COHORT_ASSIGN_OR_RETURN(auto coordinator, Coordinator::open(options, &clock));
//   COHORT_ASSIGN_OR_RETURN(std::string id, coordinator->submit(spec));
//   AgentOrders orders = coordinator->tick();   // → Agent.LaunchTasks on each placed node
//
// Attempt life: placed (slots reserved, rendezvous open, launch orders out) → RUNNING once every
// node reported its tasks started → every rank exits 0: SUCCEEDED; any rank exits non-zero, is
// killed, or its node is lost: the attempt fails (the others get stop orders, the rendezvous closes
// so no rank waits on a dead peer) and the restart policy decides PENDING (attempt + 1) or FAILED.
// A node's slots are released when every rank of the attempt on it has exited (or the node is
// lost), so a restarted attempt never overlaps a draining one.
//
// Thread-safe: every public method takes one internal lock. Only events() and the Rendezvous
// methods block (with timeouts); methods that write a job state block on the database's fsync.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cohort/v1/job.pb.h"
#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/job.h"
#include "daemon/coordinator/job_spec_validation.h"
#include "daemon/coordinator/job_store.h"
#include "daemon/coordinator/node_registry.h"
#include "daemon/coordinator/placement.h"
#include "daemon/coordinator/rendezvous.h"
#include "daemon/coordinator/scheduler.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

// Events kept in memory per job for watchers (state changes stay in the database regardless);
// bounds memory for long jobs that report metrics every few seconds.
inline constexpr size_t kDefaultMaxEventsPerJob = 10000;

// A finished job's records are kept this long (7 days): long enough to look back on last week's
// runs, short enough that a busy cluster's database stays small. Daemon config job_retention.
inline constexpr Duration kDefaultJobRetention = std::chrono::hours(24 * 7);

// ListJobs pages: a long-lived coordinator holds many thousands of finished jobs, and one response
// carrying them all would exceed the message cap and hold the lock for long. A request asking for
// more than the maximum gets the maximum.
inline constexpr size_t kDefaultJobsPageSize = 100;
inline constexpr size_t kMaxJobsPageSize = 1000;

// While the job store cannot be written (a full disk, an I/O error), how often the coordinator
// tries a write again; it accepts no job changes until one succeeds (see store_status()).
inline constexpr Duration kDefaultStoreRetryInterval = std::chrono::seconds(1);

// How long a placed attempt waits for every node to report its tasks started (or its launch
// failed) before tick() gives up on the nodes that did not: their launch or its report was lost
// (a launch failure report refused while the store failed). Generous, because orders are carried
// out one at a time and a stop ahead of a launch may wait out a task's stop grace period.
inline constexpr Duration kDefaultStartTimeout = std::chrono::minutes(5);

// No rank may need more memory than this, whatever the cluster: a model this large is a mistake in
// the spec (a 2-billion-unit linear layer), not a job to queue until a big enough node joins.
inline constexpr int64_t kMaxEstimatedBytesPerRank = int64_t{1} << 40;  // 1 TiB

// One page of jobs in submission order.
struct JobPage {
  std::vector<Job> jobs;
  int64_t next_after_seq = 0;  // pass as after_seq for the next page; 0 on the last page
};

// What a job needs of the cluster, checked at submit against what the cluster has.
struct CapacityRequest {
  bool wait_for_capacity = false;        // queue a job larger than the cluster instead of refusing it
  int64_t estimated_bytes_per_rank = 0;  // parameters + activations of one rank (0: unknown)
};

struct CoordinatorOptions {
  std::string data_dir;                                 // job database directory (required)
  Duration node_lease = kDefaultNodeLease;              // a node silent this long is lost
  size_t max_events_per_job = kDefaultMaxEventsPerJob;  // in-memory event history per job
  // Roots besides each job's own directory that spec paths may lie under (daemon config
  // allowed_path_roots); submit() refuses specs whose paths point elsewhere.
  std::vector<std::string> allowed_path_roots = {kDefaultAllowedPathRoot};
  // Executables command jobs may run (daemon config allowed_commands); empty: any.
  std::vector<std::string> allowed_commands;
  // After a restart, how long the attempts that were PLACED or RUNNING wait for their nodes to
  // register and report them (RegisterNode.running) before they fail; 0: one node lease (every
  // live agent registers again within it).
  Duration reconcile_window = Duration(0);
  // How long a finished job's records (job row, placement, events, metrics history) are kept after
  // it ended (daemon config job_retention); tick() deletes them after that. Agents keep the job's
  // log directory as long (AgentLogRetention).
  Duration job_retention = kDefaultJobRetention;
  // While job store writes fail, how often tick() tries a write again (issue 16).
  Duration store_retry_interval = kDefaultStoreRetryInterval;
  // How long after its placement an attempt's nodes must have reported its tasks started (or their
  // launch failed); see kDefaultStartTimeout.
  Duration start_timeout = kDefaultStartTimeout;
  // Opens the job store. Empty: the embedded default, SQLite in data_dir (JobStore::open). A highly
  // available coordinator passes one that opens its EtcdJobStore (daemon/etcd), fenced on its
  // election key.
  std::function<StatusOr<std::unique_ptr<JobStore>>()> open_store;
};

// Start these tasks of an attempt on one node (Agent.LaunchTasks).
struct LaunchOrder {
  std::string job_id;
  int attempt = 0;
  NodeAssignment node;  // the node, its ranks and GPUs
  int world_size = 0;
  int num_nodes = 0;
  std::string master_address;  // host of node rank 0
  cohort::v1::JobSpec spec;
};

// Stop every task of an attempt on one node (Agent.StopTasks).
struct StopOrder {
  std::string node_id;
  std::string address;
  std::string job_id;
  int attempt = 0;
  std::string reason;
};

// What agents must do as a result of a coordinator call.
struct AgentOrders {
  std::vector<LaunchOrder> launches;
  std::vector<StopOrder> stops;

  bool empty() const { return launches.empty() && stops.empty(); }
};

// How a launch failed, which decides what it says about the node.
enum class LaunchFailure {
  // The agent answered and could not start the tasks (a spawn error, a missing binary): the node
  // itself is fine.
  kRefused,
  // The agent did not answer (UNAVAILABLE, DEADLINE_EXCEEDED): it is dead, stopped or cut off, and
  // the node is suspect until it heartbeats again.
  kUnreachable,
};

// An agent saw a task exit.
struct TaskExit {
  std::string node_id;
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  int exit_code = 0;  // the exit status when it exited by itself
  int signal = 0;     // the signal that killed it, 0 if none
  // What the agent saw when it killed the task itself ("pid 42 stopped (SIGSTOP or SIGTSTP) for
  // 5.0 s ..."); empty for an exit of its own. Becomes part of the job's reason.
  std::string detail{};
};

// An attempt an agent holds tasks of, as RegisterNode reports it.
struct RunningAttempt {
  std::string job_id;
  int attempt = 0;
  std::vector<int> ranks{};  // global ranks still running there
  // Its ranks there that exited, as the agent saw them (it keeps them until it forgets the job),
  // reported or not: after a restart or takeover they tell how ranks ended during the outage.
  // Their node_id, job_id and attempt are taken from the registration.
  std::vector<TaskExit> exited{};
};

class Coordinator {
 public:
  // Opens the job store in options.data_dir, reloads every job and event, and recovers: queued
  // jobs re-enter the queue; attempts that were PLACED or RUNNING when the last coordinator stopped
  // wait up to options.reconcile_window for their nodes to register and report them (see
  // register_node), and fail through the restart policy if some node does not. Nodes the store
  // keeps records of (etcd) are restored with a lease from now (NodeRegistry::restore_node), the
  // slots of the recovered attempts reserved on them, and take new work once their agents register. `clock` is not owned
  // and must outlive the coordinator. Blocks on disk I/O.
  static StatusOr<std::unique_ptr<Coordinator>> open(CoordinatorOptions options, const Clock* clock);

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;
  // Calls shutdown().
  ~Coordinator();

  // ---- nodes ----

  // Registers a node (or re-registers it) with what its agent still runs and the exits it saw
  // (reconciliation, issue 16):
  //  - a running attempt this coordinator still places there keeps running: its slots are reserved
  //    again, and an attempt recovered after a restart is re-adopted (RUNNING once all its nodes
  //    reported it, instead of failing and relaunching while its old workers still run);
  //  - reported exits of ranks it still counts as live (they ended while it restarted or took
  //    over) are taken as report_task_exit takes them: a failure fails the attempt, the last clean
  //    exit makes the job SUCCEEDED;
  //  - a running attempt it no longer owns (unknown, not placed there, or its ranks there already
  //    counted as lost) gets a stop order to this node, and so does one it still holds slots for
  //    that is over (cancelled, failed or superseded: an earlier stop may not have arrived);
  //  - ranks placed there that the agent neither runs nor reports exited are lost (the agent
  //    restarted or forgot them): the attempt fails as on a lost node, and the orders stop its
  //    other tasks.
  // INVALID_ARGUMENT for malformed info. When a store write fails part way (UNAVAILABLE; the agent
  // registers again), what was already decided and stored stays, and so must its orders (stops of
  // an attempt whose failure was stored): they go to `unsent` when given, for the caller to send.
  StatusOr<AgentOrders> register_node(NodeInfo info, const std::vector<RunningAttempt>& running = {},
                                      AgentOrders* unsent = nullptr);
  // Renews a node's lease. NOT_FOUND: the node must register again.
  Status heartbeat(const std::string& node_id, bool unschedulable = false);
  // The same, from an agent that reports what it runs now (HeartbeatRequest.running): returns a stop
  // for each reported attempt with ranks still running that this coordinator no longer runs on the
  // node, so tasks whose StopTasks never arrived (every retry failed, a partition) stop while the
  // node stays registered instead of running on until fencing or its next registration. Only
  // judgments that hold whoever leads order a stop: the attempt is older than the job's current one
  // (superseded), the job is finished, cancelled or failed, or it is PLACED or RUNNING at that attempt
  // and none of the attempt's ranks on the node is live any more. An unknown job, an attempt newer
  // than the job's current one, and a job PENDING at the reported attempt order nothing: a new
  // leader this (deposed, not yet aware) coordinator does not know of may have launched them; the
  // node's next registration reconciles those. Nothing is inferred from what the report leaves out. The stops' `address` is empty: they
  // travel in the heartbeat's reply. The lease is renewed first; NOT_FOUND orders nothing. Needs no
  // store write.
  StatusOr<std::vector<StopOrder>> heartbeat(const std::string& node_id, bool unschedulable,
                                             const std::vector<RunningAttempt>& running);
  // Drops a node now, as if its lease had run out (`cohort node revoke`): its attempts fail over
  // by their restart policy. No orders go to the node itself.
  AgentOrders remove_node(const std::string& node_id, const std::string& reason);
  // Live nodes with free capacity, by node id.
  std::vector<NodeStatus> list_nodes() const;
  Duration node_lease() const { return nodes_.lease(); }
  // The spec checks submit() makes, with this coordinator's allowed path roots.
  JobSpecValidationOptions validation_options() const;

  // ---- jobs ----

  // Validates `spec`, records the job (durably) and queues it; returns its id. INVALID_ARGUMENT
  // naming every bad field; UNAVAILABLE while shutting down; the store's error if it cannot write.
  // Placement happens at the next tick().
  // `owner`: the submitting user (recorded; empty in tests that need no owner).
  StatusOr<std::string> submit(const cohort::v1::JobSpec& spec, const std::string& owner = "");
  // A copy of one job's record. NOT_FOUND for an unknown id.
  StatusOr<Job> get_job(const std::string& job_id) const;
  // Copies of every job's record in submission order.
  std::vector<Job> list_jobs() const;
  // The jobs with seq > after_seq that `keep` accepts (every job when it is empty), in submission
  // order, at most `limit` (>= 1) of them; next_after_seq is set when more may follow.
  JobPage list_jobs_page(int64_t after_seq, size_t limit,
                         const std::function<bool(const Job&)>& keep = nullptr) const;

  // Whether the cluster as registered now can ever run `spec`: RESOURCE_EXHAUSTED naming both
  // numbers when it needs more nodes, slots per node or GPUs than the live nodes have (unless
  // request.wait_for_capacity: it then waits in the queue for nodes to join), or when the
  // estimated memory of its ranks on one node exceeds the largest node's memory. The gRPC adapter
  // calls it before submit(). Non-blocking.
  Status check_capacity(const cohort::v1::JobSpec& spec, const CapacityRequest& request) const;
  // Cancels a job: PENDING leaves the queue; PLACED / RUNNING get stop orders for their tasks.
  // NOT_FOUND for an unknown id; FAILED_PRECONDITION for a finished job.
  StatusOr<AgentOrders> cancel(const std::string& job_id, const std::string& reason);

  // The periodic step: expires nodes whose lease ran out (failing or restarting their jobs), gives
  // up on nodes that did not report a placed attempt's tasks started within
  // options.start_timeout (the attempt fails naming them; they get stop orders in case the tasks
  // did start, and their slots are free again), and places queued jobs in FIFO order. Returns the
  // launches and stops for agents.
  AgentOrders tick();

  // Every task of an attempt on `node_id` started. When all of the attempt's nodes have reported,
  // the job is RUNNING. Reports for attempts that are over are ignored. NOT_FOUND for an unknown
  // job; INVALID_ARGUMENT for a node outside the attempt's placement.
  Status report_tasks_started(const std::string& node_id, const std::string& job_id, int attempt);

  // A task exited. A non-zero exit or a signal fails the attempt (reason naming the rank, node and
  // code) and returns stop orders for its other tasks; the last rank exiting 0 makes the job
  // SUCCEEDED. Exits of attempts that are over only release their slots. NOT_FOUND for an unknown
  // job; INVALID_ARGUMENT for a rank not placed on that node.
  StatusOr<AgentOrders> report_task_exit(const TaskExit& exit);

  // The agent of `node_id` could not start the attempt's tasks there (a missing worker binary, a
  // spawn error, the agent unreachable): its ranks count as exited without having run, and the
  // attempt fails through the restart policy with a reason naming the node and `error`; the orders
  // stop the attempt's tasks on its other nodes. Reports for attempts that are over are ignored.
  // With LaunchFailure::kUnreachable the node also becomes suspect (NodeRegistry::mark_suspect):
  // placement skips it until its agent heartbeats or registers again, so a dead or stopped agent
  // whose lease has not run out yet costs the restarted attempt nothing (found by the chaos test:
  // without it every restart landed on the same dead node until all restarts were used). The node
  // is marked even when the attempt is over or the store cannot be written.
  // NOT_FOUND for an unknown job; INVALID_ARGUMENT for a node outside the attempt's placement.
  StatusOr<AgentOrders> report_launch_failure(const std::string& node_id, const std::string& job_id,
                                              int attempt, const std::string& error,
                                              LaunchFailure kind = LaunchFailure::kRefused);

  // The attempt's launch order for `node_id` was never sent because the attempt was over before
  // its turn came (failed, cancelled or restarted while the order was queued): nothing runs
  // there, so the node's ranks count as exited and its slots and GPUs are free again (without
  // this a node that never hears of the attempt keeps them reserved for good). Needs no store
  // write. FAILED_PRECONDITION while the attempt is still active; NOT_FOUND for an unknown job.
  Status report_launch_skipped(const std::string& node_id, const std::string& job_id, int attempt);

  // Records training progress of the current attempt (older attempts' reports are dropped),
  // appends it to the job's stored metrics history and publishes it to watchers (the job row's
  // last metrics are written with the job's next write). A store failure is logged, not returned:
  // the worker cannot fix it. NOT_FOUND for an unknown job.
  Status report_metrics(const std::string& job_id, int attempt, const Metrics& metrics);

  // The job's stored metrics reports with seq > after_seq, oldest first (attempt 0: every
  // attempt); survives coordinator restarts. Blocks on disk I/O. NOT_FOUND for an unknown job.
  StatusOr<std::vector<MetricsRecord>> metrics_history(const std::string& job_id, int64_t after_seq,
                                                       int attempt) const;

  // OK while the job store takes writes. After a write failed: UNAVAILABLE naming the failed write.
  // In that state the coordinator changes no job (memory never runs ahead of the store): submit,
  // cancel, register_node, remove_node, task exit and launch failure reports and metrics reports
  // return that error (agents retry their reports; clients retry), and tick() neither expires
  // nodes nor places jobs; it tries a write every options.store_retry_interval and, once one
  // succeeds, carries out what was deferred (node losses, attempts whose nodes all started). The
  // server reports gRPC health NOT_SERVING meanwhile. Non-blocking.
  Status store_status() const;

  // Refuses new submissions from now on (UNAVAILABLE "draining") while jobs already accepted go on;
  // the first step of a graceful shutdown. Idempotent.
  void start_draining();

  // ---- rendezvous ----

  // The rendezvous of a placed attempt, for the Rendezvous service to call into (its blocking
  // calls run outside the coordinator's lock). NOT_FOUND for an unknown job; FAILED_PRECONDITION
  // when that attempt is not placed (queued, finished, or superseded by a restart).
  StatusOr<std::shared_ptr<Rendezvous>> rendezvous(const std::string& job_id, int attempt) const;

  // ---- events ----

  // The job's events with seq > after_seq, oldest first. When there are none yet, blocks up to
  // `timeout` for one and then returns what there is (possibly nothing), so a WatchJob stream can
  // check for a departed client between calls. NOT_FOUND for an unknown job; UNAVAILABLE once
  // shutting down.
  StatusOr<std::vector<JobEvent>> events(const std::string& job_id, int64_t after_seq, Duration timeout);

  // Stops accepting jobs, closes every rendezvous and wakes every watcher (with UNAVAILABLE), and
  // writes each unfinished job's latest metrics. Idempotent; blocks on disk I/O.
  void shutdown();

 private:
  using AttemptKey = std::pair<std::string, int>;  // (job id, attempt)

  // An attempt that holds slots: running, or failed/cancelled and still draining.
  struct LiveAttempt {
    Placement placement;
    std::set<std::string> started_nodes;  // nodes whose tasks all started
    std::set<int> live_ranks;             // ranks that have not exited
    std::shared_ptr<Rendezvous> rendezvous;
    // Recovered after a restart and not yet reported by every node: the time it fails by.
    std::optional<TimePoint> reconcile_deadline;
    std::set<std::string> adopted_nodes;  // nodes that reported it since the restart
    // Placed by this coordinator: the time by which every node must have reported its tasks
    // started (options_.start_timeout); reset once all did or tick() gave up on the rest.
    std::optional<TimePoint> start_deadline;
  };

  Coordinator(CoordinatorOptions options, const Clock* clock, std::unique_ptr<JobStore> store);

  Status recover_locked(JobStore::Snapshot snapshot);
  // register_node's work under mu_; `orders` collects its orders, also those decided before an error.
  Status register_node_locked(NodeInfo info, const std::vector<RunningAttempt>& running, AgentOrders& orders);
  // The Rendezvous of a recovered PLACED / RUNNING attempt, with what the store's journal of it
  // holds (a takeover on a shared store); empty when there is none or it cannot be read (logged).
  std::shared_ptr<Rendezvous> recover_rendezvous_locked(const Job& job, const Placement& placement);
  StatusOr<Job*> find_job_locked(const std::string& job_id);
  // INVALID_ARGUMENT for an attempt number the job never had.
  Status check_attempt_locked(const Job& job, int attempt) const;
  // Whether `key` is the job's current attempt and still PLACED or RUNNING.
  bool is_active_locked(const AttemptKey& key) const;
  // Whether attempt `key` holds slots and a rank of it placed on `node_id` has not exited.
  bool has_live_rank_on_locked(const AttemptKey& key, const std::string& node_id) const;
  // Why node `node_id` must not run attempt `key`, judged so that any leader would agree (for a
  // heartbeat's stop); empty when it may, or when only another leader could know.
  std::string over_on_node_locked(const AttemptKey& key, const std::string& node_id) const;

  // Moves the job to `to` (after `edit` changed other fields of the new record) and records it.
  // Write first (issue 16): the new record and its event are stored before the job in memory
  // changes, so on a store failure nothing changes, the coordinator stops taking changes
  // (store_failed_locked) and the error (UNAVAILABLE) is returned. An illegal move is a
  // coordinator bug: logged, INTERNAL, the job left as it was.
  Status transition_locked(Job& job, JobState to, std::string reason,
                           const std::function<void(Job&)>& edit = nullptr);
  // Stores `next` (a changed copy of `job`) with the transition's event, then makes it the job and
  // publishes the event; timestamps are set here. On a store failure nothing changes.
  Status record_locked(Job& job, Job next, const JobTransition& change);
  void publish_locked(JobEvent event);
  // UNAVAILABLE while the store cannot be written (see store_status()), naming the failed write.
  Status check_store_locked() const;
  // A write failed: stop taking changes until a retried write succeeds. Returns the UNAVAILABLE
  // error callers pass on.
  Status store_failed_locked(const Status& error);
  // Retries a write when one is due; true once the store takes writes again (or never failed).
  bool retry_store_locked();

  // Places queued jobs; appends launch orders.
  void place_locked(AgentOrders& orders);
  // Fails the job's current attempt (the restart policy picks PENDING or FAILED), closes its
  // rendezvous, and appends stop orders for its tasks still running. The two halves, for callers
  // that must mark ranks exited in between: record_attempt_failure_locked stores the transition
  // (nothing changes when the store fails: its error is returned), attempt_failed_locked acts on it.
  Status fail_attempt_locked(Job& job, const std::string& reason, AgentOrders& orders);
  Status record_attempt_failure_locked(Job& job, const std::string& reason);
  void attempt_failed_locked(Job& job, int attempt, const std::string& reason, AgentOrders& orders);
  // Closes an attempt's rendezvous with `why` and appends stop orders for its nodes that still have
  // live ranks.
  void stop_attempt_locked(const AttemptKey& key, const Status& why, AgentOrders& orders);
  // A node is gone: its ranks count as exited and the active attempts with ranks there fail. When
  // the store fails on the way, the loss is kept in lost_nodes_ and finished once it writes again.
  void node_lost_locked(const std::string& node_id, const std::string& reason, AgentOrders& orders);
  // A rank of the attempt `key` (held in attempts_, `exit.rank` placed on `exit.node_id`) exited as
  // `exit` says; nothing for a rank already counted as exited. A failure fails the active attempt,
  // the last clean exit makes the job SUCCEEDED; the transition is stored before the rank counts
  // as exited, so on a store failure nothing changes and its error is returned. May forget the
  // attempt (forget_if_drained_locked). `node_is_gone`: as rank_exited_locked.
  Status take_exit_locked(const AttemptKey& key, const TaskExit& exit, bool node_is_gone, AgentOrders& orders);
  // A rank of `key` exited; when it was its node's last live rank, the node's reservation is
  // released (unless the node itself is gone, taking its capacity with it).
  void rank_exited_locked(const AttemptKey& key, int rank, bool node_is_gone);
  // Forgets an attempt once every rank has exited.
  void forget_if_drained_locked(const AttemptKey& key);
  // PLACED → RUNNING once every node of the active attempt has started (the store's error if the
  // transition cannot be stored; the attempt then stays PLACED until tick() retries it).
  Status maybe_running_locked(const AttemptKey& key);
  // Recovered attempts whose reconcile deadline passed with nodes missing: those nodes' ranks count
  // as lost and the attempt fails through its restart policy.
  void expire_unreconciled_locked(AgentOrders& orders);
  // Placed attempts past their start deadline with nodes that never reported their tasks started:
  // an active one fails naming those nodes; those nodes get stop orders and their ranks count as
  // exited, freeing their slots.
  void expire_unstarted_locked(AgentOrders& orders);
  // Brings the store's node records in step with the registry: writes the record of each
  // registered node whose info differs from the stored one (a registration, never a heartbeat) and
  // deletes the records of nodes that are gone (lost or removed). A failed write is logged and
  // tried again at the next call (tick); node records are a head start for a coordinator taking
  // over, so a failure does not stop job changes.
  void sync_node_records_locked();
  // Deletes the jobs that finished more than options_.job_retention ago (and hold no slots any
  // more) from memory and from the store. A store failure is logged; the job is tried again at
  // the next tick.
  void delete_expired_jobs_locked();

  const CoordinatorOptions options_;
  const Clock* const clock_;
  const std::unique_ptr<JobStore> store_;

  mutable std::mutex mu_;
  std::condition_variable events_changed_;  // a job event was published, or shutdown
  bool shutting_down_ = false;
  bool draining_ = false;  // submit() refuses new jobs
  NodeRegistry nodes_;
  Scheduler scheduler_;
  std::map<std::string, Job> jobs_;                         // by id
  std::map<AttemptKey, LiveAttempt> attempts_;              // attempts holding slots
  std::map<std::string, std::deque<JobEvent>> job_events_;  // by job id, oldest first
  int64_t next_job_seq_ = 1;
  int64_t next_event_seq_ = 1;
  // Store health (issue 16): the write that failed, while writes fail; when to try again.
  std::optional<Status> store_failure_;
  TimePoint next_store_retry_{};
  // Jobs whose submit was refused after a save that may have landed (no answer from the store):
  // deleted from the store before it counts as writable again, so no record the client was told
  // failed loads as PENDING at the next start or takeover (retry_store_locked).
  std::vector<std::string> unrecorded_jobs_;
  // Nodes found gone whose attempts could not be failed because a write failed: node id → reason.
  std::map<std::string, std::string> lost_nodes_;
  // The node records the store holds (JobStore::put_node), by node id: loaded at open, kept in step
  // with the registry by sync_node_records_locked.
  std::map<std::string, NodeInfo> stored_nodes_;
  bool node_sync_failing_ = false;  // a node record write failed (logged once until one succeeds)
};

}  // namespace cohort::coordinator
