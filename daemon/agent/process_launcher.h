#pragma once

// ProcessLauncher: the agent's seam over fork/exec (STYLE rule 7). The TaskSupervisor launches,
// signals and reaps worker processes only through this interface, so its failure paths can be
// driven by a fake launcher; PosixProcessLauncher is the real one.
//
// Every launched process leads its own process group (pgid == pid), so that signalling the group
// reaches whatever the worker itself forked (a data loader, a shell's background job) and a stop
// leaves no process behind. A process can leave its group (setsid, a daemon's double fork), so
// where the host has a writable cgroup v2 the launcher also puts each process into a cgroup of its
// own before it execs (set_task_cgroups, task_cgroups.h), which no unprivileged process can leave:
// killing the cgroup ends everything the task started.
//
// Every child is also confined before exec (issue 11, "jobs run unprivileged"): it switches to
// LaunchOptions::run_as when given (the agent is root), sets PR_SET_NO_NEW_PRIVS (no setuid binary
// or file capability can raise it again), the resource limits below, and PR_SET_PDEATHSIG(SIGKILL)
// so that it dies with the launcher's process (a SIGKILLed agent or `cohort run` leaves no worker).
//
// Example:
//   PosixProcessLauncher launcher;
//   LaunchOptions options;
//   options.argv = {"/bin/echo", "hello"};
//   options.on_stdout = [](std::string_view bytes) { ... };
//   COHORT_ASSIGN_OR_RETURN(std::unique_ptr<ProcessHandle> process, launcher.launch(options));
//   ... process->poll_exit() until it returns a value ...

#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "daemon/agent/task_cgroups.h"
#include "daemon/agent/unix_user.h"
#include "worker/base/status.h"

namespace cohort::agent {

// Resource limits of every launched process (soft and hard; lowered to the launcher's own hard
// limit where that is lower, since an unprivileged agent cannot raise it).
// No core files: a rank's core is the size of its model and may hold the job's secret.
inline constexpr rlim_t kChildCoreFileBytes = 0;
// Open files per process: UCX and NCCL keep a few descriptors per peer and gRPC a few per
// channel, so 64 Ki serves thousands of peers while bounding a leak.
inline constexpr rlim_t kChildMaxOpenFiles = 64 * 1024;
// Processes and threads per real uid (RLIMIT_NPROC counts every thread of every job of that user
// on the node): a libtorch rank runs a few hundred threads, so 64 Ki fits any real node's ranks
// and stops a fork bomb long before the kernel's pid space runs out.
inline constexpr rlim_t kChildMaxProcesses = 64 * 1024;

// How long a child may take from fork to execve (its chdir into the working directory, then the
// exec of argv[0]). Both touch the filesystem as the job's user: a path on a hung mount (an NFS
// server gone) blocks them in the kernel with no end, and a launch waiting for them would hold its
// caller (the agent's LaunchTasks) forever. 8 s is far beyond a healthy exec, even of a large
// binary on a slow network filesystem, and stays under the coordinator's default LaunchTasks
// deadline (peer_rpc_timeout_ms, 10 s), so a launch held up by one hung exec fails with the exec's
// own error, naming the directory or program, rather than a bare "deadline exceeded".
inline constexpr std::chrono::milliseconds kDefaultExecTimeout = std::chrono::seconds(8);

// How a process ended.
struct ExitStatus {
  int exit_code = 0;  // the value passed to exit(); meaningful when signal == 0
  int signal = 0;     // the signal that terminated it, or 0 if it exited

  bool success() const { return signal == 0 && exit_code == 0; }
  // "exit code 3" or "killed by signal 9 (Killed)".
  std::string to_string() const;
  // From a waitpid() status word.
  static ExitStatus from_wait_status(int wait_status);

  friend bool operator==(const ExitStatus& a, const ExitStatus& b) {
    return a.exit_code == b.exit_code && a.signal == b.signal;
  }
};

// Receives a chunk of a process's output. Called from the launcher's reader thread, never
// concurrently for one process; the bytes are valid only during the call.
using OutputCallback = std::function<void(std::string_view bytes)>;

struct LaunchOptions {
  std::vector<std::string> argv;  // argv[0] is the executable's path (no PATH search)
  std::vector<std::string> env;   // the complete environment, "NAME=value" each
  std::string working_dir;        // empty: the launcher's own working directory
  OutputCallback on_stdout;       // empty: stdout is discarded
  OutputCallback on_stderr;       // empty: stderr is discarded
  // Switch to this user (supplementary groups, gid, uid) before exec; needs a root launcher.
  // nullopt: the child keeps the launcher's user.
  std::optional<UnixUser> run_as;
  // The exec handshake's deadline (kDefaultExecTimeout); must be positive. Past it the launch is
  // DEADLINE_EXCEEDED naming the working directory and the path, and the child is killed (and reaped
  // later, without holding up other launches, should it stay stuck in the kernel).
  std::chrono::milliseconds exec_timeout = kDefaultExecTimeout;
  // The name of the process's cgroup in the launcher's TaskCgroups (one path component of
  // [A-Za-z0-9._-], unique among the processes running; the supervisor gives
  // "<job>.attempt-<N>.rank-<R>"), used only when the launcher has them. Empty: "task-<n>".
  std::string cgroup_name;
};

// One launched process and its process group. Thread-safe.
class ProcessHandle {
 public:
  virtual ~ProcessHandle() = default;

  virtual pid_t pid() const = 0;
  // The process group the process leads; equal to pid().
  virtual pid_t pgid() const = 0;

  // Sends `sig` to every process of the group. A group that no longer exists is not an error
  // (the processes are gone, which is what a stop wants). Once poll_exit has returned the exit
  // (the leader is reaped) it sends nothing: the pid, and with it the group id, may already belong
  // to an unrelated process, and poll_exit killed what was left of the group before the reap.
  // Non-blocking; thread-safe with poll_exit.
  virtual Status signal_group(int sig) = 0;

  // Reaps the process if it has exited; its exit status then and on every later call, nullopt
  // while it runs. Whatever is left of its group when it has exited (children it started) is
  // SIGKILLed before the reap: a task ends with its leader, even inside a stop's grace period.
  // Non-blocking.
  virtual std::optional<ExitStatus> poll_exit() = 0;

  // Whether the process is stopped now (SIGSTOP, SIGTSTP, a tracer): none of its threads runs, so
  // it neither makes progress nor heartbeats, and only its parent can tell (issue 16's hang
  // detection). False once it was reaped or when it cannot tell. Non-blocking. The default
  // (fake launchers) never sees a stop.
  virtual bool is_stopped() { return false; }

  // Blocks until the process's stdout and stderr are closed (every writer, children included, has
  // exited or closed them) and every byte was delivered to the callbacks, or `timeout` passes.
  // Returns whether the output was drained.
  virtual bool wait_output_closed(std::chrono::milliseconds timeout) = 0;

  // SIGKILLs every process of the task: its group (until the reap, as signal_group) and, when it
  // has a cgroup, every process in the cgroup, so also those that left the group (setsid, a
  // daemon's double fork); the cgroup is the task's alone, so that part acts after the reap too.
  // Does not wait for them to die. Non-blocking (where the kernel lacks cgroup.kill, the freezer
  // fallback waits at most the cgroup's empty timeout). The default (fake launchers, no cgroup):
  // signal_group(SIGKILL).
  virtual Status kill_all() { return signal_group(SIGKILL); }

  // Once the exit was reaped (poll_exit, which killed what was left in the cgroup): waits until
  // the cgroup is empty, at most its empty timeout, and removes it. OK when there is none or it is
  // gone; FAILED_PRECONDITION while the process runs; DEADLINE_EXCEEDED naming the pids left (the
  // handle's destructor tries again, and so does the agent's next start). Blocking. The default:
  // OK.
  // All of it (the kills too) ends by `deadline` at the latest, so a caller removing several
  // tasks' cgroups can share one bound (TaskSupervisor::stop).
  virtual Status remove_cgroup(std::chrono::steady_clock::time_point /*deadline*/) { return ok_status(); }
  Status remove_cgroup() { return remove_cgroup(std::chrono::steady_clock::time_point::max()); }

  // The process's cgroup directory; empty when it has none (no cgroup v2, a fake launcher).
  virtual std::string cgroup_path() const { return ""; }
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;

  // Starts a process in its own process group (and cgroup, where the launcher has them). An error
  // (a missing or non-executable binary, a
  // missing working directory) is returned here, naming the path; the launch never turns into a
  // child that silently exits. Blocking only until the child has exec'd, at most
  // options.exec_timeout (then DEADLINE_EXCEEDED). Thread-safe.
  virtual StatusOr<std::unique_ptr<ProcessHandle>> launch(const LaunchOptions& options) = 0;
};

// fork + setpgid + cgroup.procs + (setgroups, setgid, setuid) + prctl + setrlimit + execve, stdout and stderr
// through pipes drained by one reader thread per process, stdin from /dev/null. The handle's
// destructor kills the group if the process is still running and reaps it, so no process outlives
// its handle, and none of its cgroup either.
//
// Every fork happens on one thread the launcher owns for its whole life: PR_SET_PDEATHSIG fires
// when the *thread* that forked the child exits, not the process, and launches arrive on gRPC
// handler threads that the gRPC runtime may end at any time, which would SIGKILL healthy workers.
// The launcher therefore must outlive every process it launched (its destruction kills them).
// The fork thread only forks: the wait for the child's exec (the exec-error pipe, bounded by
// exec_timeout) happens on the calling thread, so one child stuck in chdir or execve on a hung
// mount holds up no other launch. A child killed at the deadline is reaped by the fork thread
// whenever the kernel lets it go.
class PosixProcessLauncher final : public ProcessLauncher {
 public:
  PosixProcessLauncher();
  // Ends the fork thread; processes still running receive SIGKILL from the kernel.
  ~PosixProcessLauncher() override;
  PosixProcessLauncher(const PosixProcessLauncher&) = delete;
  PosixProcessLauncher& operator=(const PosixProcessLauncher&) = delete;

  // Hands the launch to the fork thread and waits for its result. Thread-safe.
  StatusOr<std::unique_ptr<ProcessHandle>> launch(const LaunchOptions& options) override;

  // Contains every later launch in a cgroup of `cgroups` (created before the fork; the child
  // moves itself in before anything else, while it is still the launcher's user); nullptr: process
  // groups only. Processes launched before keep what they had. Thread-safe.
  void set_task_cgroups(std::shared_ptr<TaskCgroups> cgroups);
  // What set_task_cgroups set (nullptr: none). Thread-safe.
  std::shared_ptr<TaskCgroups> task_cgroups() const;

 private:
  struct Request;
  void fork_loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Reaps (WNOHANG) the children killed at their exec deadline that have died since. Holds mu_.
  void reap_abandoned_locked();

  std::vector<Request*> queue_;  // guarded by mu_; owned by the waiting launch() calls
  std::vector<pid_t> abandoned_;  // guarded by mu_; killed at the exec deadline, not reaped yet
  bool shutdown_ = false;        // guarded by mu_
  std::shared_ptr<TaskCgroups> cgroups_;  // guarded by mu_; nullptr: process groups only
  std::thread fork_thread_;
};

#ifdef COHORT_PROCESS_LAUNCHER_TEST_HOOKS
// Compiled only into :process_launcher_with_test_hooks (process_launcher_test).
namespace testing_hooks {
// While set, a forked child with a working_dir waits in pause() just before its chdir and execve, as one whose chdir
// or execve hangs on a dead mount would (it never reaches execve, and SIGKILL ends it).
extern std::atomic<bool> child_hangs_before_exec;
}  // namespace testing_hooks
#endif

}  // namespace cohort::agent
