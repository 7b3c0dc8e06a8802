#pragma once

// Leftover tasks: processes that an earlier run of this agent started and that outlived it. A rank
// has PR_SET_PDEATHSIG, so it dies with its agent (a crash, SIGKILL, the OOM killer), but what the
// rank started itself (a shell's children, a launcher's workers, data loaders) does not, and the
// restarted agent knows nothing of them: they would keep the CPUs, memory and GPUs that the
// coordinator hands to other jobs, and nothing would ever stop them (the chaos test,
// tests/cluster/chaos_test.sh, found `sleep` children of killed ranks running on).
//
// Every task carries COHORT_JOB_DIR=<job_dir_root>/<job id> in its environment and its children
// inherit it, so an agent starting up finds them by their initial environment (/proc/PID/environ)
// and kills them before it registers and launches anything. The root is the agent's own (its data
// directory), so two agents on one machine never touch each other's tasks.
//
//   for (const LeftoverTask& task : kill_leftover_tasks(data_dir + "/jobs")) log(task);

#include <sys/types.h>

#include <string>
#include <vector>

namespace cohort::agent {

// The variable that marks a task's processes (set by the agent for every rank).
inline constexpr const char* kJobDirVariable = "COHORT_JOB_DIR";

struct LeftoverTask {
  pid_t pid = 0;
  std::string job_dir;  // its COHORT_JOB_DIR
  std::string command;  // its command line, spaces between the arguments (for the log)
};

// Processes other than this one whose initial environment has COHORT_JOB_DIR inside
// `job_dir_root` (a path under it, not the root itself). Processes that cannot be read (gone, or
// another user's without the privilege) are skipped. `proc_root` is for tests. Blocking: one pass
// over /proc. Thread-safe.
std::vector<LeftoverTask> find_leftover_tasks(const std::string& job_dir_root, const std::string& proc_root = "/proc");

// SIGKILLs what find_leftover_tasks finds and returns them. Call it before launching anything: the
// agent's own running tasks would match too. Blocking: one pass over /proc.
std::vector<LeftoverTask> kill_leftover_tasks(const std::string& job_dir_root);

}  // namespace cohort::agent
