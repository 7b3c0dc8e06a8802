#pragma once

// TaskCgroups: contains each task's processes in a cgroup v2 of its own, so that nothing a rank
// starts outlives the task. A process group (process_launcher.h) holds only the processes that
// stay in it: `setsid sleep 10000 &`, a daemonizing tool or a double fork leaves it, and such a
// process would keep the node's CPUs, memory and GPUs after the job, where the coordinator hands
// them to another job. A cgroup cannot be left by an unprivileged process, so killing it
// (cgroup.kill) ends every process the task ever started.
//
// Layout (the agent owns everything from cohort-tasks down; jobs can write none of it):
//   <agent's own cgroup>/cohort-tasks/<agent key>/<task>
// - <agent's own cgroup>: the "0::" line of /proc/self/cgroup, under the cgroup2 mount found in
//   /proc/self/mountinfo (/sys/fs/cgroup on a pure cgroup v2 host, /sys/fs/cgroup/unified on a
//   hybrid one). Under systemd that cgroup belongs to systemd unless the unit has Delegate=yes
//   (deploy/systemd/cohortd.service), which hands the subtree to the agent.
// - <agent key>: one directory per agent (named after its data directory), since several agents
//   may share a machine and a cgroup (a test cluster) and one agent's leftover cleanup must never
//   kill another's tasks.
// - <task>: one cgroup per task (rank), not per job attempt: a rank is the unit the agent
//   launches, reaps and reports, and one rank ending (its strays killed with it) must not touch the
//   ranks of the same attempt that still run here.
//
// cgroup v2's "no internal processes" rule forbids processes in a cgroup whose subtree_control
// enables controllers. The agent enables no controller anywhere (it uses only the core files:
// cgroup.procs, cgroup.kill, cgroup.freeze, cgroup.events), so its own cgroup may keep the agent
// process while it has children, and cohort-tasks and the agent key hold no process at all. Limits
// per task (memory.max, cpu.max) would need controllers enabled in the agent's own cgroup, and thus
// the agent moved into a leaf of its own first; nothing here does that.
//
// Security: every directory is made by the agent (root, or the user a delegated subtree belongs
// to) with mode 0755, so the job's user (job_user / user_map) can neither write cgroup.procs to
// move a process out (moving needs write access to the common ancestor's cgroup.procs), nor remove
// or kill the cgroup. A non-root agent runs jobs as its own user, which could move them: the same
// user is the same trust there.
//
// Example:
//   TaskCgroupsOptions options;
//   options.agent_key = data_dir;
//   StatusOr<std::shared_ptr<TaskCgroups>> cgroups = TaskCgroups::open(options);
//   if (!cgroups.ok()) { warn(...); /* process groups only */ }
//   for (const LeftoverCgroup& left : (*cgroups)->remove_leftovers()) log(left);
//   launcher.set_task_cgroups(*cgroups);

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "worker/base/status.h"

namespace cohort::agent {

// After a kill, how long a cgroup may take to empty: the kernel ends SIGKILLed processes within
// milliseconds, so only one stuck in uninterruptible sleep (a hung NFS or GPU driver call) takes
// longer, and then the cgroup is left for a later removal rather than blocking the agent.
inline constexpr std::chrono::milliseconds kDefaultCgroupEmptyTimeout = std::chrono::seconds(5);
// The directory below the agent's own cgroup that holds every agent's task cgroups.
inline constexpr const char* kTaskCgroupsDirectory = "cohort-tasks";

struct TaskCgroupsOptions {
  // Names this agent's directory below cohort-tasks (its data directory: unique per agent on a
  // machine); required.
  std::string agent_key;
  // Where the kernel says what is mounted and which cgroup this process is in (tests).
  std::string mountinfo_path = "/proc/self/mountinfo";
  std::string self_cgroup_path = "/proc/self/cgroup";
  // Kill with cgroup.kill where the kernel has it (5.14+). false: always the fallback (freeze,
  // SIGKILL every pid in cgroup.procs, thaw), which older kernels get; for its tests.
  bool use_cgroup_kill = true;
  // How long a killed cgroup may take to empty (kDefaultCgroupEmptyTimeout).
  std::chrono::milliseconds empty_timeout = kDefaultCgroupEmptyTimeout;
};

// One task's cgroup. Thread-safe. The destructor of one that TaskCgroups::create made kills what
// is left in it and removes it, unless that was done already (bounded by empty_timeout; a cgroup
// that would not empty is left for remove_leftovers at the next start).
//
// Everything acts through a descriptor of the cgroup's own directory, opened when it was made, and
// never through its path once it is removed: a later task's cgroup may have the same name (a job
// id given again after a coordinator's restore), and a handle kept for its logs must never kill
// that task. A removed cgroup's descriptor finds nothing (its files are gone), so a late kill()
// or destructor does nothing.
class TaskCgroup {
 public:
  ~TaskCgroup();
  TaskCgroup(const TaskCgroup&) = delete;
  TaskCgroup& operator=(const TaskCgroup&) = delete;

  // The cgroup's directory, e.g. /sys/fs/cgroup/system.slice/cohortd.service/cohort-tasks/k/t.
  const std::string& path() const { return path_; }
  // Its cgroup.procs opened for writing (close-on-exec): a forked child writes "0" to it to move
  // itself in before it execs (process_launcher.cc). Owned by this object.
  int procs_fd() const { return procs_fd_; }

  // SIGKILLs every process in the cgroup: cgroup.kill, or where the kernel lacks it the fallback
  // (freeze, so nothing forks meanwhile; SIGKILL each pid of cgroup.procs; thaw). Does not wait for
  // them to be gone. Non-blocking with cgroup.kill; the fallback waits for the freeze, at most
  // empty_timeout. Nothing once the cgroup was removed.
  Status kill() const;
  // Whether any process is still in the cgroup (cgroup.events "populated"); false once it is gone.
  bool populated() const;
  // kill(), then waits until the cgroup is empty and removes it; all of it (the kills included)
  // within empty_timeout or by `deadline`, whichever comes first. DEADLINE_EXCEEDED naming the
  // cgroup and what is left when it does not empty; OK when it was removed before (by this object,
  // or a directory of that name is now another cgroup). Blocking.
  Status kill_and_remove(
      std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) const;
  // Whether kill_and_remove removed it (or found it gone).
  bool removed() const { return removed_.load(); }

 private:
  friend class TaskCgroups;
  // `dir_fd`: the cgroup's directory (O_DIRECTORY), owned; -1 when it was gone already. `owned`:
  // made by create(), so the destructor removes it.
  TaskCgroup(std::string path, int dir_fd, int procs_fd, bool owned, bool use_cgroup_kill,
             std::chrono::milliseconds empty_timeout);
  // kill() with the fallback's freeze wait bounded by `deadline`.
  Status kill_until(std::chrono::steady_clock::time_point deadline) const;

  const std::string path_;
  const int dir_fd_;
  const int procs_fd_;
  const bool owned_;
  const bool use_cgroup_kill_;
  const std::chrono::milliseconds empty_timeout_;
  // Set once the directory was removed (or found replaced): from then on nothing acts on it.
  mutable std::atomic<bool> removed_{false};
};

// A cgroup an earlier run of this agent left, and the processes remove_leftovers killed in it.
struct LeftoverCgroup {
  std::string path;
  std::vector<pid_t> pids;  // what was in it before the kill
  Status removed;           // OK, or why it is still there
};

// The agent's directory of task cgroups. Thread-safe.
class TaskCgroups {
 public:
  // Finds the cgroup2 mount and this process's cgroup, makes <own>/cohort-tasks/<agent key>
  // (kept if it exists), and checks that a child can move itself into a cgroup there (one probe
  // fork). FAILED_PRECONDITION saying what was looked for and why it cannot be used (no cgroup2
  // mount, the agent's cgroup not found in it, not writable) when there is no usable hierarchy:
  // the caller then runs tasks in process groups only.
  static StatusOr<std::shared_ptr<TaskCgroups>> open(const TaskCgroupsOptions& options);
  // Removes the agent's directory if it is empty (every task cgroup gone), and cohort-tasks if
  // that is empty too.
  ~TaskCgroups();
  TaskCgroups(const TaskCgroups&) = delete;
  TaskCgroups& operator=(const TaskCgroups&) = delete;

  // <own>/cohort-tasks/<agent key>: where the task cgroups are.
  const std::string& path() const { return path_; }
  // Whether kills use cgroup.kill (the kernel has it and options allow) or the freezer fallback.
  bool uses_cgroup_kill() const { return use_cgroup_kill_; }

  // Makes the cgroup <path()>/<name> (one path component of [A-Za-z0-9._-]) and opens its
  // cgroup.procs. An existing empty one of that name (an earlier task's that could not be removed
  // then) is replaced; one that still holds processes is ALREADY_EXISTS naming them, never killed
  // (a name given twice must not end another task). Blocking (filesystem).
  StatusOr<std::unique_ptr<TaskCgroup>> create(const std::string& name) const;

  // Kills and removes every task cgroup in path(): what an earlier run of this agent left (the
  // stray processes of its ranks, which outlive a killed agent). Call before launching anything:
  // the agent's own tasks would go too. Blocking, at most empty_timeout per leftover.
  std::vector<LeftoverCgroup> remove_leftovers() const;

 private:
  // The existing cgroup at `path`, opened for a look or a kill but not owned (its destructor
  // leaves it); one whose directory is gone acts as removed.
  std::unique_ptr<TaskCgroup> existing(const std::string& path) const;

  TaskCgroups(std::string path, bool use_cgroup_kill, std::chrono::milliseconds empty_timeout);

  const std::string path_;
  bool use_cgroup_kill_;  // set by open() before the object is shared
  const std::chrono::milliseconds empty_timeout_;
};

// The cgroup v2 directory this process is in, from `mountinfo_path` and `self_cgroup_path`:
// the cgroup2 mount point joined with the "0::" path (relative to the mount's root).
// FAILED_PRECONDITION saying what is missing, or when the path has a ".." component (the process
// is outside the root of the cgroup namespace it runs in, so its cgroup is not reachable below
// the mount). Blocking (reads two /proc files).
StatusOr<std::string> own_cgroup_directory(const std::string& mountinfo_path,
                                           const std::string& self_cgroup_path);

// The agent key for a data directory: its absolute, normalized form (std::filesystem::
// weakly_canonical: no trailing '/', no "." or "..", symbolic links of existing parts resolved), so
// "/var/lib/cohort/", "/var/lib/cohort" and a relative path to it name one agent's directory, and a
// restarted agent finds what it left whichever way the directory was written.
std::string agent_key_for_data_dir(const std::string& data_dir);

// A cgroup directory's name for `key` (a path): its characters outside [A-Za-z0-9._-] replaced by
// '-', at most 100 of them kept (the end), then a hash of the whole key, so two keys never share a
// name and the name stays readable in `systemd-cgls`.
std::string cgroup_name_for(const std::string& key);

}  // namespace cohort::agent
