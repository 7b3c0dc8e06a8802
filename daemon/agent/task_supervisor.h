#pragma once

// TaskSupervisor: runs the tasks of jobs on this node — one worker process per rank, each in its
// own process group with the job's environment — captures each rank's output, and reports every
// exit through one callback so the coordinator learns promptly that a rank died and can stop the
// others (no rank waits forever on a dead peer).
//
// A rank's environment: the agent's base environment, then the job's extra variables, then the
// ones cohort owns (which win): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, COHORT_JOB_ID, COHORT_NODE_ID, COHORT_COORDINATOR.
//
// Stopping a job sends SIGTERM to each rank's process group, waits up to the grace period for
// them to exit, then sends SIGKILL to every group (which also removes stragglers a worker forked)
// and, where the launcher contains tasks in cgroups (task_cgroups.h), kills each rank's cgroup,
// which also ends what left the group (setsid, a daemon's double fork). A rank's end, stopped or
// not, kills whatever is left in its cgroup and removes the cgroup: nothing a rank started
// outlives it.
//
// Example:
//   PosixProcessLauncher launcher;
//   TaskSupervisorOptions options;
//   options.log_dir = "/var/log/cohort";
//   options.node_id = "node-a";
//   TaskSupervisor supervisor(options, &launcher, [&](const TaskExit& exit) { report(exit); });
//   JobTasks job;  // job_id, argv, world_size, ranks, master address ...
//   COHORT_RETURN_IF_ERROR(supervisor.launch(job));
//   ...
//   COHORT_RETURN_IF_ERROR(supervisor.stop(job.job_id));

#include <sys/types.h>
#include <time.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/agent/log_capture.h"
#include "daemon/agent/log_retention.h"
#include "daemon/agent/process_launcher.h"
#include "daemon/agent/unix_user.h"
#include "daemon/coordinator/clock.h"
#include "worker/base/rank_heartbeat.h"
#include "worker/base/status.h"

namespace cohort::agent {

using Duration = coordinator::Duration;

// 10 s: long enough for a worker to write a final checkpoint shard and close its connections on
// SIGTERM, short enough that a cancel feels immediate. (Kubernetes uses 30 s for whole pods.)
inline constexpr Duration kDefaultStopGracePeriod = std::chrono::seconds(10);
// How often the monitor reaps exited processes: the bound on how late an exit is reported.
inline constexpr Duration kDefaultExitPollInterval = std::chrono::milliseconds(50);
// After a process exits, how long to wait for its pipes to deliver the last bytes (a grandchild
// holding them open must not delay the exit report longer than this).
inline constexpr Duration kDefaultOutputDrainTimeout = std::chrono::seconds(2);
// Each rank's cgroup removal waits at least this long even when the shared wait
// (TaskSupervisorOptions::cgroup_removal_wait) is spent: a SIGKILLed stray takes milliseconds.
inline constexpr Duration kMinimumCgroupRemovalWait = std::chrono::milliseconds(100);
// After SIGKILL, how long to wait for the kernel to reap; only a process stuck in
// uninterruptible sleep (a hung NFS or GPU driver call) takes longer.
inline constexpr Duration kKillWaitTimeout = std::chrono::seconds(10);

// Hang detection (issue 16): a stopped or frozen rank holds every peer in its next collective until
// the collective timeout (minutes), and only its node can see it. The monitor therefore watches each
// running rank two ways, and kills a rank (its group, SIGKILL) whose exit it then reports with what
// it saw (TaskExit::detail), which fails or restarts the job by its restart policy:
//  - its process state (/proc): stopped (SIGSTOP, SIGTSTP, a tracer) for stopped_task_limit;
//  - its heartbeat: the rank touches COHORT_HEARTBEAT_FILE every few seconds from a thread of its
//    own (worker/base/rank_heartbeat.h; cohort-worker does, a command job may), so a rank busy in a
//    long computation still beats, and one whose every thread is frozen does not. Only a rank that
//    has beaten once is held to heartbeat_timeout: a program that never beats is watched by its
//    process state alone.
// A rank stopped this long is killed. Short, since a stopped rank holds all its peers; long enough
// that an operator's or a debugger's brief stop (kill -STOP, kill -CONT) passes. With the heartbeat
// timeout below, a stop is seen within 15 s whatever the collective timeout.
inline constexpr Duration kDefaultStoppedTaskLimit = std::chrono::seconds(5);
// A rank that beat once and then goes this long without a beat is killed: five of the library's
// beats (kDefaultRankHeartbeatInterval, 2 s), so one late beat under load does not kill it.
inline constexpr Duration kDefaultHeartbeatTimeout = std::chrono::seconds(10);
// The heartbeat file of a rank, in JobTasks::heartbeat_dir; its path is COHORT_HEARTBEAT_FILE.
inline constexpr const char* kHeartbeatFileFormat = "heartbeat-rank-{}";

// Ended jobs whose records and log rings the agent keeps (for `cohort logs` after the end); beyond
// it the oldest ended ones are forgotten, so a long-lived agent's memory stays bounded (each keeps
// a ring buffer per rank). Their log files stay on disk.
inline constexpr size_t kDefaultMaxFinishedJobs = 64;

// A job's rank logs on one node, all its attempts and ranks here together, are capped at this many
// bytes on disk: a new attempt first removes older attempts' files (oldest output first) until they
// keep at most half the cap, then its ranks share what is left evenly, each rotating at half its
// share (see reserve_attempt_logs, LogCaptureOptions). The newest output is kept, and neither a
// chatty job nor one that restarts many times can fill the disk. The agent's setting
// max_log_bytes_per_job overrides it.
inline constexpr uint64_t kDefaultMaxLogBytesPerJob = uint64_t{1} << 30;  // 1 GiB

struct TaskSupervisorOptions {
  std::string log_dir;                        // rank logs go to <log_dir>/<job_id>/rank-<rank>.log
  std::string node_id;                        // COHORT_NODE_ID
  std::string coordinator_address;            // COHORT_COORDINATOR (host:port); empty: from JobTasks.env
  bool inherit_environment = true;            // start each task from the agent's own environment
  std::vector<std::string> base_environment;  // extra "NAME=value" applied after the inherited one
  Duration stop_grace_period = kDefaultStopGracePeriod;        // SIGTERM → SIGKILL
  Duration exit_poll_interval = kDefaultExitPollInterval;      // monitor period
  Duration output_drain_timeout = kDefaultOutputDrainTimeout;  // exit → last output bytes
  const coordinator::Clock* clock = nullptr;           // times the grace period; nullptr: the system clock
  size_t max_finished_jobs = kDefaultMaxFinishedJobs;  // ended jobs kept; older ones are forgotten
  uint64_t max_log_bytes_per_job = kDefaultMaxLogBytesPerJob;  // rank logs of a job here, every attempt; 0: no cap
  // A job's log directory (every attempt) is deleted once nothing was written to it for this long
  // and none of its tasks runs here (log_retention.h; daemon config job_retention); 0: kept forever.
  Duration log_retention = std::chrono::duration_cast<Duration>(kDefaultLogRetention);
  // Where the jobs' own directories are (<data_dir>/jobs: COHORT_JOB_DIR, checkpoints and scratch);
  // each is deleted under the same rule as its logs (log_retention, remove_expired_job_dirs).
  // Empty: none are deleted.
  std::string job_dir_root;
  Duration stopped_task_limit = kDefaultStoppedTaskLimit;  // stopped this long: killed; 0: never
  Duration heartbeat_timeout = kDefaultHeartbeatTimeout;   // silent this long after a beat: killed; 0: never
  // How often ranks are asked to beat (COHORT_HEARTBEAT_INTERVAL_MS beside COHORT_HEARTBEAT_FILE);
  // keep it well under heartbeat_timeout (DaemonConfig requires at most half).
  Duration heartbeat_interval = kDefaultRankHeartbeatInterval;
  // Each task's exec handshake deadline (LaunchOptions::exec_timeout; daemon config exec_timeout_ms).
  Duration exec_timeout = kDefaultExecTimeout;
  // How long the cgroup removals of the ranks reaped together (one stop, one monitor pass) may wait
  // for their cgroups to empty, all of them together (each at least kMinimumCgroupRemovalWait):
  // ranks whose strays hang in the kernel then cost one wait, not one each.
  Duration cgroup_removal_wait = std::chrono::duration_cast<Duration>(kDefaultCgroupEmptyTimeout);
  // The CPUs the node's ranks share, for their default OMP_NUM_THREADS (environment_for);
  // 0: the agent's own CPU affinity (available_cores()).
  int cpu_count = 0;
  // Tasks this node runs at once (the daemon's `slots`): a rank's default share of the CPUs is at
  // most 1 / slots of them, since other jobs' ranks may take the other slots.
  int slots = 1;
  // Where the ranks' shared-memory segments are named (shm_open's directory). A rank that dies
  // between creating its communicator's segment and its peers mapping it leaves the name behind
  // (worker/comm/shm); the agent removes such names when it reaps the rank. Empty: it does not.
  std::string shared_memory_dir = "/dev/shm";
};

// The tasks of one job that run on this node.
struct JobTasks {
  std::string job_id;
  // The attempt: its rank logs go to <log_dir>/<job_id>/attempt-<N>/rank-<R>.log, so every
  // attempt's output stays readable (`cohort logs --attempt N`); 0: <log_dir>/<job_id>/rank-<R>.log.
  int attempt = 0;
  std::vector<std::string> argv;           // the worker command; argv[0] an absolute path
  std::string working_dir;                 // empty: the agent's working directory
  int world_size = 0;                      // ranks in the whole job
  std::vector<int> ranks;                  // global ranks placed here; LOCAL_RANK is the index in this list
  std::string master_addr;                 // MASTER_ADDR
  int master_port = 0;                     // MASTER_PORT
  std::map<std::string, std::string> env;  // the job's extra environment
  // Extra environment of single ranks (CUDA_VISIBLE_DEVICES, COHORT_INIT's local_rank), by global
  // rank; applied after `env`, before the variables cohort owns.
  std::map<int, std::map<std::string, std::string>> rank_env;
  // The Unix user the ranks run as (the agent is root); nullopt: the agent's own user.
  std::optional<UnixUser> run_as;
  // Where the ranks' heartbeat files go (a directory the ranks' user may write, e.g. the job's
  // own); each rank gets COHORT_HEARTBEAT_FILE=<heartbeat_dir>/heartbeat-rank-<R>. Empty: no
  // heartbeat, the process state alone is watched.
  std::string heartbeat_dir;
};

// One rank's exit, as reported to the callback.
struct TaskExit {
  std::string job_id;
  int rank = 0;
  ExitStatus status;
  bool stopped = false;  // the exit followed stop(): a cancel, not a failure
  // Set when the supervisor killed the rank for a hang: what it saw, e.g. "pid 42 stopped
  // (SIGSTOP or SIGTSTP) for 5.0 s; the agent killed it (stopped_task_limit 5.0 s)".
  std::string detail{};
};

// Called once per task exit, from the supervisor's monitor thread or from the thread in stop().
// Must not block for long; it may call any TaskSupervisor method except stop() and the destructor
// (hand a stop to another thread).
using TaskExitCallback = std::function<void(const TaskExit&)>;

// A rank's state, for listing.
struct TaskInfo {
  int rank = 0;
  pid_t pid = 0;
  std::optional<ExitStatus> exit;  // nullopt while running
  std::string log_path;
  std::string detail{};  // why the supervisor killed it (a hang, as TaskExit::detail); empty otherwise
  std::string cgroup{};  // its cgroup directory (removed once it ended); empty without containment
};

// Thread-safe.
class TaskSupervisor {
 public:
  // `launcher` must outlive the supervisor.
  TaskSupervisor(TaskSupervisorOptions options, ProcessLauncher* launcher, TaskExitCallback on_exit);
  // Stops every job that still runs, all their ranks together (blocking up to one grace period
  // plus kKillWaitTimeout), then the monitor.
  ~TaskSupervisor();
  TaskSupervisor(const TaskSupervisor&) = delete;
  TaskSupervisor& operator=(const TaskSupervisor&) = delete;

  // Starts one process per rank. The job id must pass validate_job_id (it names the job's log
  // directory; no link below log_dir is followed). All or nothing: if a rank cannot start, the ranks already
  // started are killed and the error names the job and rank. A job id whose tasks still run is
  // ALREADY_EXISTS; one whose tasks all ended is replaced (a restart). Blocking until each
  // process has exec'd.
  Status launch(const JobTasks& job);

  // SIGTERM to each rank's process group, SIGKILL to all groups and cgroups after the grace
  // period (or as soon as every rank exited, for stragglers). Blocks until every rank is reaped,
  // at most the grace period plus kKillWaitTimeout. NOT_FOUND for an unknown job; OK for one
  // already ended.
  Status stop(const std::string& job_id);

  // The rank's captured output; it stays readable after the job ends until forget(). Non-blocking.
  StatusOr<std::shared_ptr<LogCapture>> log(const std::string& job_id, int rank) const;

  // Reads a rank's log files from disk (rotated part first), the part `selection` picks, to
  // `on_data` until it returns false: for an attempt other than the one in memory, or once the
  // agent restarted or forgot the job. attempt 0: the newest attempt with a log for the rank.
  // NOT_FOUND naming the path when there is none. Blocking (disk reads).
  Status read_log_files(const std::string& job_id, int attempt, int rank, const LogSelection& selection,
                        const std::function<bool(std::string_view)>& on_data) const;

  // The job's ranks, ascending. NOT_FOUND for an unknown job. Non-blocking.
  StatusOr<std::vector<TaskInfo>> tasks(const std::string& job_id) const;

  // Tasks still running on this node, over all jobs (used slots). Non-blocking.
  int running_tasks() const;

  // Ids of the jobs with at least one task still running, ascending. Non-blocking.
  std::vector<std::string> running_jobs() const;

  // Ids of every job it holds, running or ended (until forget()), ascending. Non-blocking.
  std::vector<std::string> jobs() const;

  // Drops an ended job's records and logs from memory (the log files stay). FAILED_PRECONDITION
  // while any of its ranks runs.
  Status forget(const std::string& job_id);

 private:
  struct Task {
    std::string job_id;
    int rank = 0;
    std::unique_ptr<ProcessHandle> process;
    uid_t uid = 0;  // the user it runs as (its segments' owner)
    std::shared_ptr<LogCapture> log;
    std::optional<ExitStatus> exit;  // guarded by mu_
    bool stopping = false;           // guarded by mu_
    bool claimed = false;            // guarded by mu_; someone is reporting this task's exit
    uint64_t exit_order = 0;         // guarded by mu_; when it exited, in exits_recorded_ counts
    std::string hang_detail;         // guarded by mu_; why the monitor killed it (empty: it did not)
    // Hang detection state, touched by the monitor thread only.
    std::string heartbeat_path;                        // empty: no heartbeat
    std::optional<struct timespec> heartbeat_mtime;    // the file's mtime when last looked at
    std::optional<coordinator::TimePoint> last_beat;   // when a change was last seen; nullopt: never
    std::optional<coordinator::TimePoint> stopped_since;  // first seen stopped, in this stop
  };
  using Job = std::map<int, std::shared_ptr<Task>>;

  std::vector<std::string> environment_for(const JobTasks& job, int rank, int local_rank) const;
  // Starts one rank; its log files may keep attempt_log_bytes / (ranks here) bytes (0: no cap).
  StatusOr<std::shared_ptr<Task>> start_task(const JobTasks& job, int rank, int local_rank,
                                             uint64_t attempt_log_bytes);
  // What is left of the wait that the cgroup removals of ranks reaped together share
  // (options_.cgroup_removal_wait); one per stop() or monitor pass, used by one thread.
  using RemovalBudget = std::chrono::steady_clock::duration;
  // Reaps the task if its process exited, removes its cgroup (waiting at most what is left of
  // `budget`, which it spends, but kMinimumCgroupRemovalWait at least), and reports the exit
  // exactly once. Returns whether it has exited. Call without holding mu_.
  bool check_exit(const std::shared_ptr<Task>& task, RemovalBudget* budget);
  // Marks the job's running tasks as being stopped (their exits are reported as stops, and the
  // hang checks leave them alone) and appends all its tasks to `tasks`. Call holding mu_.
  void mark_stopping(Job& job, std::vector<std::shared_ptr<Task>>* tasks);
  // stop()'s work on `tasks` (already marked stopping): SIGTERM to all, SIGKILL to all after the
  // grace period, and the reaps. `what` starts the error.
  Status stop_tasks(const std::vector<std::shared_ptr<Task>>& tasks, const std::string& what);
  // Unlinks the shared-memory segment names (options_.shared_memory_dir) that reaped process
  // `pid`, running as `uid`, created and its peers never mapped: those `uid` owns, older than
  // `reaped_at`. Not removed: names made by a rank that changed its own user after the launch
  // (an entrypoint that drops root itself), or from inside another user or pid namespace.
  void remove_orphaned_segments(pid_t pid, uid_t uid, std::chrono::system_clock::time_point reaped_at) const;
  // Whether the task's exit was reported. Non-blocking.
  bool exit_recorded(const std::shared_ptr<Task>& task) const;
  // Polls the tasks until all exited or `done()` says to give up.
  bool wait_all_exited(const std::vector<std::shared_ptr<Task>>& tasks, const std::function<bool()>& give_up,
                       RemovalBudget* budget);
  void monitor_loop();
  // Every kLogRetentionSweepInterval (by the clock): deletes the log directories of jobs quiet for
  // options_.log_retention (none of their tasks running here) and forgets those jobs, and deletes
  // the job directories (options_.job_dir_root) quiet as long. Monitor thread only, without mu_.
  void sweep_expired_logs();
  // One look at a running task's process state and heartbeat; kills it (recording why) when it
  // was stopped or silent too long. Monitor thread only, without mu_.
  void check_hang(const std::shared_ptr<Task>& task);
  // Moves the oldest ended jobs beyond options_.max_finished_jobs into `forgotten` (to destroy
  // after mu_ is released: their handles join reader threads), sparing `keep`.
  void forget_oldest_finished_locked(const std::string& keep, std::vector<Job>* forgotten);

  const TaskSupervisorOptions options_;
  ProcessLauncher* const launcher_;
  const TaskExitCallback on_exit_;
  coordinator::SystemClock system_clock_;
  const coordinator::Clock* const clock_;

  mutable std::mutex mu_;
  std::condition_variable shutdown_cv_;
  bool shutdown_ = false;            // guarded by mu_
  std::map<std::string, Job> jobs_;  // guarded by mu_
  uint64_t exits_recorded_ = 0;      // guarded by mu_
  std::thread monitor_;
  std::optional<coordinator::TimePoint> last_log_sweep_;  // monitor thread only
  // The job directory sweep in progress or done (sweep_expired_logs); monitor thread only. Its
  // destructor (after the monitor ended) waits for a sweep under way; it touches no member.
  std::future<void> job_dir_sweep_;
};

}  // namespace cohort::agent
