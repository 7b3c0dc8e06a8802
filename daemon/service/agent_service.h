#pragma once

// AgentService: the cohort.v1.Agent gRPC adapter over the node agent's TaskSupervisor. It
// validates requests at the edge, turns a LaunchTasks request into the supervisor's JobTasks (the
// worker command comes from the agent's options, not the wire), serves a rank's captured output
// from its LogCapture, and describes the node (probe_node_inventory plus slots).
//
//   AgentServiceOptions options;
//   options.node_id = "node-a";
//   options.slots = 8;
//   options.worker_command = {"/usr/local/bin/cohort-worker"};
//   AgentService service(&supervisor, options);
//   builder.RegisterService(&service);
//
// The supervisor keys tasks by job id only, so the service remembers which attempt of each job it
// launched last (attempt_of) for the daemon's exit reports.
//
// Thread-safe: gRPC calls it on its handler threads concurrently.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "cohort/v1/agent.grpc.pb.h"
#include "daemon/agent/job_user_holder.h"
#include "daemon/agent/task_supervisor.h"
#include "daemon/agent/unix_user.h"
#include "worker/base/status.h"

namespace cohort::daemon {

// How long a following StreamLogs waits for new output before checking that its client is still
// there (a cancelled client is noticed within this).
inline constexpr std::chrono::milliseconds kLogFollowPollInterval = std::chrono::milliseconds(200);

struct AgentServiceOptions {
  std::string node_id;                      // this node's registry id (NodeInfo.node_id)
  std::string address;                      // the agent's host:port as the coordinator dials it
  int slots = 1;                            // worker processes this node runs at once
  std::vector<std::string> worker_command;  // argv of every task; argv[0] an absolute path
  // How this node reaches the coordinator (COHORT_COORDINATOR, COHORT_INIT); empty: the address the
  // coordinator gives in LaunchTasks (right when both run in one daemon).
  std::string coordinator_address;
  // Where each attempt's job_spec.pb goes: <spec_dir>/<job_id>/attempt-<N>/job_spec.pb (the
  // supervisor's log directory, so a job's files sit together). Required for LaunchTasks.
  std::string spec_dir;
  // The cluster CA (PEM), handed to ranks as COHORT_CA_CERTIFICATE so they can reach the
  // coordinator over TLS; empty for a plaintext development daemon.
  std::string ca_certificate_pem;
  // Unix user the ranks of a job run as when its owner has no entry in user_map (an agent running
  // as root never runs a job as root).
  std::string job_user = "cohort-job";
  // cohort user name -> Unix user name for the ranks of that user's jobs.
  std::map<std::string, std::string> user_map;
  // false: job_user serves one owner on this node (agent::JobUserHolder, recorded in
  // <parent of job_dir_root>/job_user.holder); another owner's job that would run as it is refused.
  // true: every owner without a user_map entry shares it, and so can read and signal the others' jobs.
  bool shared_job_user = false;
  // An agent that is not root cannot switch users: it runs jobs (as its own uid, which owns the
  // data directory's CA key and admin credentials) only when this is set, i.e. every cohort user
  // may act as the operator (`cohort run`'s embedded cluster sets it). Ignored when root.
  bool run_jobs_as_daemon_user = false;
  // Where each job's own directory goes: <job_dir_root>/<job_id>/ (mode 0700, owned by the job's
  // user; COHORT_JOB_DIR and the ranks' working directory; kept across attempts, so checkpoints
  // there survive a restart, and deleted by the supervisor's retention sweep once quiet for
  // job_retention, TaskSupervisorOptions::job_dir_root). Empty: <parent of spec_dir>/jobs, i.e.
  // <data_dir>/jobs by default.
  std::string job_dir_root;
  // How long start_draining() waits for launches under way to end (their tasks are then stopped
  // and listed by the supervisor, so the drain stops them and reports their exits).
  std::chrono::milliseconds drain_launch_wait = agent::kDefaultExecTimeout;
  // Directories (besides the job's own directory under the data dir) that a spec's
  // checkpoint.dir, dataset.path and torchscript_file may lie under.
  std::vector<std::string> allowed_path_roots;
  // Executables a command job may run here (absolute paths); empty: any.
  std::vector<std::string> allowed_commands;
  // Tests only: called by stop_reported once it has found the reported launch still the job's, before
  // it stops the tasks (without the service's lock), to let a test act in that window.
  std::function<void(const std::string& job_id)> reported_stop_checked;
};

// The worker launch contract (what cohort-worker reads), beyond the torchrun-style variables the
// supervisor sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// COHORT_JOB_ID, COHORT_NODE_ID, COHORT_COORDINATOR):
//   COHORT_ATTEMPT      the attempt number, from 1
//   COHORT_NODE_RANK, COHORT_NUM_NODES
//   COHORT_JOB_SPEC     path of the binary-serialized cohort.v1.JobSpec
//   COHORT_INIT         cohort://<coordinator>/<job_id>?attempt=<N>&local_rank=<L>
//   COHORT_RESUME=1     only on a restarted attempt whose spec asks to resume from a checkpoint
//   COHORT_JOB_DIR      the job's own directory (also the ranks' working directory)
//   COHORT_JOB_SECRET   the attempt's secret for the rendezvous and rank 0's store (when given)
//   COHORT_HEARTBEAT_FILE <job dir>/heartbeat-rank-<R>: touched by a rank every few seconds, it is
//                       held to the agent's heartbeat timeout (task_supervisor.h, hang detection)
//   CUDA_VISIBLE_DEVICES the task's GPUs (empty when it has none: CPU ranks see no GPU)
inline constexpr const char* kJobSpecFileName = "job_spec.pb";
// The job's directory: only its user reaches it. Its parent (the agent's) is searchable, not
// listable, so no job learns the others' ids from it.
inline constexpr mode_t kJobDirMode = 0700;
inline constexpr mode_t kJobDirRootMode = 0711;
// The spec file: readable by the job's user only (it owns the file; the directory is the agent's).
inline constexpr mode_t kJobSpecFileMode = 0400;

class AgentService final : public cohort::v1::Agent::Service {
 public:
  // `supervisor` is not owned and must outlive the service.
  AgentService(agent::TaskSupervisor* supervisor, AgentServiceOptions options);

  // Starts the request's tasks (all or none). RESOURCE_EXHAUSTED when they do not fit the free
  // slots; ALREADY_EXISTS while the job's tasks still run or another launch of it is under way.
  // Blocks until each process exec'd (at most agent::kDefaultExecTimeout each: DEADLINE_EXCEEDED
  // for a working_dir or command on a hung mount). Holds no lock while it touches the filesystem
  // or launches, so a launch stuck there holds up neither other jobs' launches and stops nor
  // attempt_of (the daemon's exit reports and heartbeats).
  grpc::Status LaunchTasks(grpc::ServerContext* context, const cohort::v1::LaunchTasksRequest* request,
                           cohort::v1::LaunchTasksResponse* response) override;
  // Stops the job's tasks (TERM, then KILL after the supervisor's grace period; the request's
  // grace_period_ms is not honoured per call yet). Blocks until every task is reaped. A stop of
  // the attempt being launched right now returns at once and the launch stops its tasks as soon
  // as they started; a stop of another attempt of such a job is UNAVAILABLE (sent again).
  grpc::Status StopTasks(grpc::ServerContext* context, const cohort::v1::StopTasksRequest* request,
                         cohort::v1::StopTasksResponse* response) override;
  // A rank's output (stdout and stderr interleaved as captured; `stream` other than BOTH is
  // INVALID_ARGUMENT). With `follow`, blocks until the capture closes or the client leaves.
  grpc::Status StreamLogs(grpc::ServerContext* context, const cohort::v1::StreamLogsRequest* request,
                          grpc::ServerWriter<cohort::v1::LogChunk>* writer) override;
  // The node's capacity; blocks on the inventory probe (nvidia-smi, bounded).
  grpc::Status NodeInfo(grpc::ServerContext* context, const cohort::v1::NodeInfoRequest* request,
                        cohort::v1::NodeInfo* response) override;

  // Sets the address reported by NodeInfo (known once the server has bound its port).
  void set_address(const std::string& address);

  // From now on LaunchTasks answers UNAVAILABLE "draining" (the daemon is stopping); tasks already
  // running are left to the daemon's shutdown. A launch under way that passed the draining check
  // stops the tasks it started and answers UNAVAILABLE too; this waits for such launches to end,
  // at most options.drain_launch_wait, so the supervisor holds every task the drain must stop.
  // Idempotent; thread-safe; blocking (bounded).
  void start_draining();

  // Fencing (the daemon could not renew its lease): every launch under way stops its tasks as soon
  // as they started, as if a StopTasks for it had come. Returns the (job id, attempt) of each, so
  // their exits can be reported as fenced. Non-blocking; thread-safe.
  std::vector<std::pair<std::string, int>> stop_launches_in_progress();

  // The attempt of `job_id` launched last on this node; nullopt if none. Non-blocking.
  std::optional<int> attempt_of(const std::string& job_id) const;

  // An attempt with tasks running here, as a heartbeat reports it (HeartbeatRequest.running).
  struct RunningLaunch {
    std::string job_id;
    int attempt = 0;
    uint64_t launch = 0;     // which launch of this agent started them (for stop_reported)
    std::vector<int> ranks;  // the ranks still running
  };
  // The attempts whose tasks run here now, by job id. A job being launched right now is left out
  // (until its launch ends the supervisor's tasks may be either attempt's), and so are jobs whose
  // tasks all ended. Non-blocking.
  std::vector<RunningLaunch> running_launches() const;
  // Carries out a stop that the coordinator's heartbeat reply ordered for an attempt that heartbeat
  // reported (`launch` from running_launches()), as StopTasks does (TERM, KILL after the grace period;
  // blocks until the tasks are reaped). Only the tasks of that very launch are stopped: when a
  // launch of the job is under way, or another one began since (even of the same attempt: a
  // coordinator whose records were restored may hand the job id out again), nothing is, and 0 is
  // returned. While it stops them, a LaunchTasks of the job is refused (ALREADY_EXISTS), so the
  // stop cannot reach a launch that began after the check (if the reported tasks ended by
  // themselves meanwhile). Returns how many tasks were still running and got signalled.
  StatusOr<int> stop_reported(const std::string& job_id, int attempt, uint64_t launch, const std::string& reason);

  // The node as RegisterNode and NodeInfo describe it. Blocking (the inventory probe).
  StatusOr<cohort::v1::NodeInfo> describe_node() const;

 private:
  Status launch(const cohort::v1::LaunchTasksRequest& request, cohort::v1::LaunchTasksResponse* response);
  // Stops every task of `job_id` the supervisor holds; how many were still running. Blocking.
  StatusOr<int> stop_job(const std::string& job_id);
  // The part of a launch after its slots were reserved (launching_): the job user's claim, the
  // job's directories and spec file, the supervisor's launch. Blocking (disk, fork/exec); called
  // without mu_.
  Status launch_reserved(const cohort::v1::LaunchTasksRequest& request, agent::JobTasks* job);
  // Creates (or reuses) <job_dir_root>/<job_id>, owned by `run_as`; returns its path.
  StatusOr<std::string> make_job_dir(const std::string& job_id, const std::optional<agent::UnixUser>& run_as) const;
  // The spec's working_dir, confined to the job's directory (created there, owned by the job's
  // user) or the allowed roots (must exist).
  StatusOr<std::string> working_dir_for(const std::string& working_dir, const std::string& job_dir,
                                        const std::optional<agent::UnixUser>& run_as) const;

  agent::TaskSupervisor* const supervisor_;
  AgentServiceOptions options_;  // address guarded by mu_; the rest constant
  agent::JobUserHolder job_user_holder_;  // thread-safe itself

  // A launch between its slot check and the supervisor's answer. mu_ is not held meanwhile (its
  // directories, spec file and exec may block on a slow filesystem), so its slots are reserved here
  // and later slot checks count them.
  struct PendingLaunch {
    int attempt = 0;
    int tasks = 0;                // slots reserved
    bool stop_requested = false;  // a StopTasks for this attempt came meanwhile: stopped once started
  };

  // A launch that ended with its tasks started.
  struct Launched {
    int attempt = 0;
    uint64_t launch = 0;  // from next_launch_: tells two launches of the same attempt apart
  };

  mutable std::mutex mu_;  // never held across disk I/O or a launch
  std::map<std::string, Launched> attempts_;        // guarded by mu_; job id → the launch that ended last
  uint64_t next_launch_ = 1;                        // guarded by mu_
  std::map<std::string, PendingLaunch> launching_;  // guarded by mu_; by job id
  // Jobs whose reported tasks stop_reported is stopping now (how many such calls); launch() refuses
  // them meanwhile. Guarded by mu_.
  std::map<std::string, int> reported_stops_;
  std::condition_variable launch_ended_;            // with mu_: an entry left launching_
  bool draining_ = false;                           // guarded by mu_
};

}  // namespace cohort::daemon
