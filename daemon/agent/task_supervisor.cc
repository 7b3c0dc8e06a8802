#include "daemon/agent/task_supervisor.h"

#include "daemon/agent/confined_dir.h"
#include "daemon/agent/job_id.h"
#include "daemon/agent/node_inventory.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

extern char** environ;

namespace cohort::agent {
namespace {

// Adds "NAME=value" entries to `env`, later ones replacing earlier ones of the same name.
void merge_entries(const std::vector<std::string>& entries, std::map<std::string, std::string>* env) {
  for (const std::string& entry : entries) {
    size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    (*env)[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
}

// The heartbeat file's mtime; nullopt while it does not exist. Not following a link: the file lies
// in a directory of the job's user, and a link must not make the agent look elsewhere.
std::optional<struct timespec> read_heartbeat_mtime(const std::string& path) {
  struct stat info;
  if (::fstatat(AT_FDCWD, path.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) return std::nullopt;
  return info.st_mtim;
}

bool same_time(const std::optional<struct timespec>& a, const std::optional<struct timespec>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a.has_value() || (a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec);
}

std::string heartbeat_path_for(const JobTasks& job, int rank) {
  if (job.heartbeat_dir.empty()) return "";
  return job.heartbeat_dir + "/" + fmt::format(kHeartbeatFileFormat, rank);
}

Status validate(const JobTasks& job) {
  COHORT_RETURN_IF_ERROR(validate_job_id(job.job_id, "launch"));
  if (job.argv.empty() || job.argv[0].empty()) {
    return invalid_argument_error("launch job {}: empty argv; give the worker's path", job.job_id);
  }
  if (job.world_size <= 0) {
    return invalid_argument_error("launch job {}: world_size {} must be >= 1", job.job_id, job.world_size);
  }
  if (job.ranks.empty()) return invalid_argument_error("launch job {}: no ranks", job.job_id);
  std::set<int> seen;
  for (int rank : job.ranks) {
    if (rank < 0 || rank >= job.world_size) {
      return invalid_argument_error("launch job {}: rank {} outside the world [0, {})", job.job_id, rank,
                                    job.world_size);
    }
    if (!seen.insert(rank).second) {
      return invalid_argument_error("launch job {}: rank {} given twice", job.job_id, rank);
    }
  }
  return ok_status();
}

}  // namespace

TaskSupervisor::TaskSupervisor(TaskSupervisorOptions options, ProcessLauncher* launcher,
                               TaskExitCallback on_exit)
    : options_(std::move(options)),
      launcher_(launcher),
      on_exit_(std::move(on_exit)),
      clock_(options_.clock != nullptr ? options_.clock : &system_clock_) {
  monitor_ = std::thread([this] { monitor_loop(); });
}

TaskSupervisor::~TaskSupervisor() {
  // Every job's ranks at once: one grace period for all of them, not one per job (an agent with
  // a few jobs whose ranks ignore SIGTERM would otherwise outlast systemd's stop timeout).
  std::vector<std::shared_ptr<Task>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [job_id, job] : jobs_) mark_stopping(job, &tasks);
  }
  Status stopped = stop_tasks(tasks, "agent shutdown: stopping every job");
  if (!stopped.ok()) spdlog::error("agent: {}", stopped.to_string());
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  shutdown_cv_.notify_all();
  monitor_.join();
}

std::vector<std::string> TaskSupervisor::environment_for(const JobTasks& job, int rank,
                                                         int local_rank) const {
  std::map<std::string, std::string> env;
  if (options_.inherit_environment) {
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      merge_entries({*entry}, &env);
    }
  }
  merge_entries(options_.base_environment, &env);
  for (const auto& [name, value] : job.env) env[name] = value;
  if (auto it = job.rank_env.find(rank); it != job.rank_env.end()) {
    for (const auto& [name, value] : it->second) env[name] = value;
  }
  // Several ranks on one node share its cores: unless the job (env or rank_env) or the agent's
  // environment says otherwise, each rank's OpenMP, OpenBLAS and MKL threads get its share of
  // them: the agent's CPUs over this job's ranks here or the node's slots, whichever is more
  // (other jobs may hold the other slots). Without it every rank starts a thread per core
  // (libtorch's intra-op pool, OpenBLAS's), and N ranks run N x cores busy threads. torchrun sets
  // OMP_NUM_THREADS=1 in the same case; a share keeps big nodes busy, and is 1 where the ranks
  // outnumber the CPUs.
  const int sharers = std::max(options_.slots, static_cast<int>(job.ranks.size()));
  if (sharers > 1 && env.find("OMP_NUM_THREADS") == env.end()) {
    const int cpus = options_.cpu_count > 0 ? options_.cpu_count : available_cores();
    env["OMP_NUM_THREADS"] = std::to_string(std::max(1, cpus / sharers));
  }
  env["RANK"] = std::to_string(rank);
  env["WORLD_SIZE"] = std::to_string(job.world_size);
  env["LOCAL_RANK"] = std::to_string(local_rank);
  env["LOCAL_WORLD_SIZE"] = std::to_string(job.ranks.size());
  env["MASTER_ADDR"] = job.master_addr;
  env["MASTER_PORT"] = std::to_string(job.master_port);
  env["COHORT_JOB_ID"] = job.job_id;
  env["COHORT_NODE_ID"] = options_.node_id;
  // Empty when the agent learns the address per launch (JobTasks.env carries it then).
  if (!options_.coordinator_address.empty()) env["COHORT_COORDINATOR"] = options_.coordinator_address;
  if (std::string heartbeat = heartbeat_path_for(job, rank); !heartbeat.empty()) {
    env[kHeartbeatFileVariable] = heartbeat;
    env[kHeartbeatIntervalVariable] = std::to_string(
        std::chrono::duration_cast<std::chrono::milliseconds>(options_.heartbeat_interval).count());
  }
  std::vector<std::string> entries;
  entries.reserve(env.size());
  for (const auto& [name, value] : env) entries.push_back(name + "=" + value);
  return entries;
}

StatusOr<std::shared_ptr<TaskSupervisor::Task>> TaskSupervisor::start_task(const JobTasks& job, int rank,
                                                                           int local_rank, uint64_t attempt_log_bytes) {
  auto task = std::make_shared<Task>();
  task->job_id = job.job_id;
  task->rank = rank;
  task->uid = job.run_as ? job.run_as->uid : ::geteuid();
  task->heartbeat_path = heartbeat_path_for(job, rank);
  // A file left by an earlier attempt counts only once it changes.
  if (!task->heartbeat_path.empty()) task->heartbeat_mtime = read_heartbeat_mtime(task->heartbeat_path);
  // <log_dir>/<job_id>/attempt-<N>/rank-<rank>.log, walked without following links (the job id
  // is checked); the attempt's share of the job's cap is shared evenly by its ranks here.
  COHORT_ASSIGN_OR_RETURN(ConfinedDir log_root, ConfinedDir::open(options_.log_dir, kLogDirectoryMode));
  std::vector<std::string> components = {job.job_id};
  if (job.attempt > 0) components.push_back(fmt::format("attempt-{}", job.attempt));
  COHORT_ASSIGN_OR_RETURN(ConfinedDir job_logs, log_root.subdir(components, kLogDirectoryMode));
  LogCaptureOptions log_options;
  log_options.max_file_bytes = attempt_log_bytes / std::max<size_t>(job.ranks.size(), 1);
  if (attempt_log_bytes > 0 && log_options.max_file_bytes == 0) log_options.max_file_bytes = 1;
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<LogCapture> log,
                          LogCapture::open_in(job_logs, fmt::format("rank-{}.log", rank), log_options));
  task->log = std::move(log);

  LaunchOptions launch;
  launch.argv = job.argv;
  launch.env = environment_for(job, rank, local_rank);
  launch.working_dir = job.working_dir;
  launch.run_as = job.run_as;
  // One cgroup per rank (where the launcher has them): a rank's end kills what it left, without
  // touching the job's other ranks here.
  launch.cgroup_name = fmt::format("{}.attempt-{}.rank-{}", job.job_id, job.attempt, rank);
  launch.exec_timeout = options_.exec_timeout;
  // Both streams go to one log, interleaved as they arrive, which is how people read a rank.
  std::shared_ptr<LogCapture> capture = task->log;
  launch.on_stdout = [capture](std::string_view bytes) { capture->append(bytes); };
  launch.on_stderr = [capture](std::string_view bytes) { capture->append(bytes); };
  COHORT_ASSIGN_OR_RETURN(task->process, launcher_->launch(launch));
  return task;
}

Status TaskSupervisor::launch(const JobTasks& job) {
  COHORT_RETURN_IF_ERROR(validate(job));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(job.job_id);
    if (it != jobs_.end()) {
      for (const auto& [rank, task] : it->second) {
        if (!task->exit.has_value()) {
          return already_exists_error("launch job {}: rank {} of it still runs on node {}", job.job_id, rank,
                                      options_.node_id);
        }
      }
    }
  }
  // max_log_bytes_per_job holds for all the job's attempts here together: older attempts' files
  // make room first (oldest output removed), and this attempt gets what they leave (log_retention.h).
  uint64_t attempt_log_bytes = options_.max_log_bytes_per_job;
  if (job.attempt > 0 && options_.max_log_bytes_per_job > 0) {
    StatusOr<AttemptLogBudget> budget =
        reserve_attempt_logs(options_.log_dir, job.job_id, job.attempt, options_.max_log_bytes_per_job);
    if (!budget.ok()) return budget.status().with_context(fmt::format("launch job {}", job.job_id));
    attempt_log_bytes = budget->attempt_bytes;
  }
  Job started;
  for (size_t local_rank = 0; local_rank < job.ranks.size(); ++local_rank) {
    int rank = job.ranks[local_rank];
    auto task = start_task(job, rank, static_cast<int>(local_rank), attempt_log_bytes);
    if (!task.ok()) {
      // All or nothing: the handles' destructors kill and reap the ranks already started.
      for (auto& [started_rank, started_task] : started) {
        started_task->process->kill_all().ignore_error();
      }
      return task.status().with_context(fmt::format("launch job {} rank {}", job.job_id, rank));
    }
    started[rank] = std::move(task).value();
  }
  // Destroyed after the lock is released: a handle's destructor joins its reader thread and may
  // wait for its cgroup to empty. An ended job of the same id (given again, e.g. after a
  // coordinator's restore) is among them.
  std::vector<Job> forgotten;
  std::lock_guard<std::mutex> lock(mu_);
  Job& slot = jobs_[job.job_id];
  forgotten.push_back(std::move(slot));
  slot = std::move(started);
  forget_oldest_finished_locked(job.job_id, &forgotten);
  return ok_status();
}

void TaskSupervisor::forget_oldest_finished_locked(const std::string& keep, std::vector<Job>* forgotten) {
  // Ended jobs by when their last rank exited.
  std::vector<std::pair<uint64_t, std::string>> ended;
  for (const auto& [job_id, job] : jobs_) {
    if (job_id == keep) continue;
    uint64_t last_exit = 0;
    bool running = false;
    for (const auto& [rank, task] : job) {
      running = running || !task->exit.has_value();
      last_exit = std::max(last_exit, task->exit_order);
    }
    if (!running) ended.emplace_back(last_exit, job_id);
  }
  if (ended.size() <= options_.max_finished_jobs) return;
  std::sort(ended.begin(), ended.end());
  for (size_t i = 0; i < ended.size() - options_.max_finished_jobs; ++i) {
    auto it = jobs_.find(ended[i].second);
    forgotten->push_back(std::move(it->second));
    jobs_.erase(it);
  }
}

bool TaskSupervisor::exit_recorded(const std::shared_ptr<Task>& task) const {
  std::lock_guard<std::mutex> lock(mu_);
  return task->exit.has_value();
}

bool TaskSupervisor::check_exit(const std::shared_ptr<Task>& task, RemovalBudget* budget) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (task->exit.has_value()) return true;
    if (task->claimed) return false;  // another thread is reporting it right now
  }
  // Before the reap: once reaped, the pid may be reused (poll_exit then still kills the cgroup,
  // which can take a while), and a segment made under it must look newer than this.
  const auto reaped_at = std::chrono::system_clock::now();
  std::optional<ExitStatus> exit = task->process->poll_exit();
  if (!exit.has_value()) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (task->claimed || task->exit.has_value()) return task->exit.has_value();
    task->claimed = true;
  }
  remove_orphaned_segments(task->process->pid(), task->uid, reaped_at);
  // The leader is gone, and poll_exit killed whatever it left in its group and its cgroup (also
  // what left the group: setsid, a daemon); the cgroup is removed once empty, so a rank's slot is
  // really free and no stray keeps the pipes open. Then its last output bytes are delivered before
  // the exit is reported. The wait is shared with the other ranks reaped with this one.
  const auto removal_start = std::chrono::steady_clock::now();
  const RemovalBudget removal_wait =
      std::max<RemovalBudget>(*budget, std::chrono::duration_cast<RemovalBudget>(kMinimumCgroupRemovalWait));
  Status removed = task->process->remove_cgroup(removal_start + removal_wait);
  *budget -= std::min<RemovalBudget>(*budget, std::chrono::steady_clock::now() - removal_start);
  if (!removed.ok()) {
    spdlog::warn("agent: job {} rank {} on node {} exited, but its cgroup was not removed: {}", task->job_id,
                 task->rank, options_.node_id, removed.to_string());
  }
  task->process->wait_output_closed(options_.output_drain_timeout);
  task->log->close();
  TaskExit report;
  {
    std::lock_guard<std::mutex> lock(mu_);
    task->exit = exit;
    task->exit_order = ++exits_recorded_;
    report = TaskExit{task->job_id, task->rank, *exit, task->stopping, task->hang_detail};
  }
  if (on_exit_) on_exit_(report);
  return true;
}

void TaskSupervisor::remove_orphaned_segments(pid_t pid, uid_t uid,
                                              std::chrono::system_clock::time_point reaped_at) const {
  // worker/comm/shm names a communicator's segment /cohort-<creator pid>-<16 hex digits> and
  // unlinks it once every rank has mapped it; a name still there after its creator is gone was
  // never mapped by every peer, so no setup can still succeed through it. Only names older than
  // the reap: a process that reuses the pid right after creates its own, newer one. Only names
  // the rank's user owns: the directory is shared by every user of the node (a process in
  // another pid namespace may have the same pid), and a root agent must not remove theirs.
  if (options_.shared_memory_dir.empty() || pid <= 0) return;
  const std::string prefix = fmt::format("cohort-{}-", pid);
  std::error_code error;
  for (std::filesystem::directory_iterator it(options_.shared_memory_dir, error), end; !error && it != end;
       it.increment(error)) {
    const std::filesystem::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    if (name.size() != prefix.size() + 16 || name.compare(0, prefix.size(), prefix) != 0) continue;
    if (name.find_first_not_of("0123456789abcdef", prefix.size()) != std::string::npos) continue;
    struct stat info {};
    if (::lstat(entry.path().c_str(), &info) != 0 || !S_ISREG(info.st_mode) || info.st_uid != uid) continue;
    const auto changed = std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::seconds(info.st_ctim.tv_sec) + std::chrono::nanoseconds(info.st_ctim.tv_nsec)));
    if (changed > reaped_at) continue;
    if (::unlink(entry.path().c_str()) == 0) {
      spdlog::info("agent: removed {}, the shared-memory segment of a communicator whose creator (pid {}) exited "
                   "before its peers had mapped it", entry.path().string(), pid);
    }
  }
}

bool TaskSupervisor::wait_all_exited(const std::vector<std::shared_ptr<Task>>& tasks,
                                     const std::function<bool()>& give_up, RemovalBudget* budget) {
  while (true) {
    // Asked before the pass: one reap may take a while (its cgroup wait, its output drain), so a
    // rank looked at early in a pass that ends past the deadline gets one more look, and a rank
    // that died in time is never reported as surviving.
    const bool last = give_up();
    bool all_exited = true;
    for (const auto& task : tasks) all_exited = check_exit(task, budget) && all_exited;
    if (all_exited) return true;
    if (last) return false;
    std::this_thread::sleep_for(options_.exit_poll_interval);
  }
}

Status TaskSupervisor::stop(const std::string& job_id) {
  std::vector<std::shared_ptr<Task>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return not_found_error("stop: no job {} on node {}", job_id, options_.node_id);
    mark_stopping(it->second, &tasks);
  }
  return stop_tasks(tasks, fmt::format("stop job {}", job_id));
}

void TaskSupervisor::mark_stopping(Job& job, std::vector<std::shared_ptr<Task>>* tasks) {
  for (auto& [rank, task] : job) {
    if (!task->exit.has_value()) task->stopping = true;
    tasks->push_back(task);
  }
}

Status TaskSupervisor::stop_tasks(const std::vector<std::shared_ptr<Task>>& tasks, const std::string& what) {
  // Every rank is signalled before any is reaped: a reap waits for the rank's cgroup to empty.
  // (A leader that exited but is not reaped yet still holds its group's id, and a reaped one's
  // group is not signalled: signal_group.)
  RemovalBudget budget = std::chrono::duration_cast<RemovalBudget>(options_.cgroup_removal_wait);
  for (const auto& task : tasks) {
    if (!exit_recorded(task)) task->process->signal_group(SIGTERM).ignore_error();
  }
  coordinator::TimePoint grace_deadline = clock_->now() + options_.stop_grace_period;
  wait_all_exited(
      tasks, [&] { return clock_->now() >= grace_deadline; }, &budget);
  // Ranks that exited had their groups and cgroups killed when reaped (check_exit); the rest get
  // SIGKILL, group and cgroup (what left the group never saw the SIGTERM), all of them before the
  // wait for any.
  for (const auto& task : tasks) {
    if (!exit_recorded(task)) task->process->kill_all().ignore_error();
  }
  auto kill_deadline = std::chrono::steady_clock::now() + kKillWaitTimeout;
  if (!wait_all_exited(
          tasks, [&] { return std::chrono::steady_clock::now() >= kill_deadline; }, &budget)) {
    // A rank the monitor is reporting right now has exited: not the one to name.
    std::string survivor = "a rank";
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& task : tasks) {
        if (!task->exit.has_value() && !task->claimed) {
          survivor = fmt::format("rank {} of job {}", task->rank, task->job_id);
          break;
        }
      }
    }
    return deadline_exceeded_error(
        "{}: {} survived SIGKILL for {}; it is probably stuck in the kernel "
        "(uninterruptible sleep); check `ps -o pid,stat,wchan` on node {}",
        what, survivor, coordinator::format_duration(kKillWaitTimeout), options_.node_id);
  }
  return ok_status();
}

void TaskSupervisor::monitor_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutdown_) {
    std::vector<std::shared_ptr<Task>> running;
    for (const auto& [job_id, job] : jobs_) {
      for (const auto& [rank, task] : job) {
        if (!task->exit.has_value()) running.push_back(task);
      }
    }
    lock.unlock();
    // The ranks reaped in one pass share one cgroup wait, so a few whose strays hang in the kernel
    // hold up the reports of the others (and the hang checks) once, not once each.
    RemovalBudget budget = std::chrono::duration_cast<RemovalBudget>(options_.cgroup_removal_wait);
    for (const auto& task : running) {
      check_hang(task);
      check_exit(task, &budget);
    }
    sweep_expired_logs();
    lock.lock();
    shutdown_cv_.wait_for(lock, options_.exit_poll_interval, [this] { return shutdown_; });
  }
}

void TaskSupervisor::sweep_expired_logs() {
  if (options_.log_retention.count() <= 0 || options_.log_dir.empty()) return;
  const coordinator::TimePoint now = clock_->now();
  if (last_log_sweep_.has_value() && now - *last_log_sweep_ < kLogRetentionSweepInterval) return;
  last_log_sweep_ = now;
  const std::vector<std::string> running_list = running_jobs();
  const std::set<std::string> running(running_list.begin(), running_list.end());
  // Job directories hold whatever the jobs wrote (a checkpoint tree, a million scratch files), so
  // walking them runs beside this thread, which reaps exits and watches for hangs; a sweep still
  // under way when the next is due makes that one wait. A job being launched right now is not in
  // `running`, but its launch set its directory's modification time (AgentService::make_job_dir),
  // so it is not quiet.
  const bool job_dir_sweep_idle =
      !job_dir_sweep_.valid() || job_dir_sweep_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  if (!options_.job_dir_root.empty() && job_dir_sweep_idle) {
    job_dir_sweep_ = std::async(std::launch::async, [options = LogRetentionOptions{options_.job_dir_root,
                                                                                     options_.log_retention},
                                                     now_ms = clock_->unix_millis(), running] {
      StatusOr<std::vector<std::string>> dirs = remove_expired_job_dirs(options, now_ms, running);
      if (!dirs.ok()) {
        spdlog::warn("agent: job directory retention: {}", dirs.status().to_string());
        return;
      }
      for (const std::string& job_id : *dirs) {
        spdlog::info("agent: deleted job {}'s directory {}/{}: nothing written for {} (job_retention)", job_id,
                     options.log_dir, job_id,
                     coordinator::format_duration(std::chrono::duration_cast<Duration>(options.retention)));
      }
    });
  }
  StatusOr<std::vector<std::string>> removed = remove_expired_job_logs(
      LogRetentionOptions{options_.log_dir, options_.log_retention}, clock_->unix_millis(), running);
  if (!removed.ok()) {
    spdlog::warn("agent: log retention: {}", removed.status().to_string());
    return;
  }
  for (const std::string& job_id : *removed) {
    // Its rings in memory go with its files (a task that started in between keeps it: not ended).
    forget(job_id).ignore_error();
    spdlog::info("agent: deleted the logs of job {}: nothing written for {} (job_retention)", job_id,
                 coordinator::format_duration(options_.log_retention));
  }
}

void TaskSupervisor::check_hang(const std::shared_ptr<Task>& task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A rank being stopped is on its way out; one already killed for a hang is reported once.
    if (task->stopping || task->exit.has_value() || !task->hang_detail.empty()) return;
  }
  const coordinator::TimePoint now = clock_->now();
  std::string detail;
  if (task->process->is_stopped()) {
    if (!task->stopped_since.has_value()) task->stopped_since = now;
    const Duration stopped_for = std::chrono::duration_cast<Duration>(now - *task->stopped_since);
    if (options_.stopped_task_limit.count() > 0 && stopped_for >= options_.stopped_task_limit) {
      detail = fmt::format(
          "pid {} stopped (SIGSTOP or SIGTSTP: process state T) for {}; the agent killed it "
          "(stopped_task_limit {})",
          task->process->pid(), coordinator::format_duration(stopped_for),
          coordinator::format_duration(options_.stopped_task_limit));
    }
  } else {
    task->stopped_since.reset();
  }
  if (detail.empty() && !task->heartbeat_path.empty()) {
    std::optional<struct timespec> mtime = read_heartbeat_mtime(task->heartbeat_path);
    if (mtime.has_value() && !same_time(mtime, task->heartbeat_mtime)) task->last_beat = now;
    task->heartbeat_mtime = mtime;
    // A stopped rank does not beat either; while stopped, the stop is what gets reported.
    if (task->last_beat.has_value() && !task->stopped_since.has_value() && options_.heartbeat_timeout.count() > 0) {
      const Duration silent_for = std::chrono::duration_cast<Duration>(now - *task->last_beat);
      if (silent_for >= options_.heartbeat_timeout) {
        detail = fmt::format(
            "pid {} sent no heartbeat for {} ({} not touched); the agent killed it (heartbeat_timeout {})",
            task->process->pid(), coordinator::format_duration(silent_for), task->heartbeat_path,
            coordinator::format_duration(options_.heartbeat_timeout));
      }
    }
  }
  if (detail.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (task->stopping || task->exit.has_value()) return;
    task->hang_detail = detail;
  }
  // SIGKILL ends a stopped process too; the exit is then reported with the detail (check_exit).
  task->process->kill_all().ignore_error();
}

StatusOr<std::shared_ptr<LogCapture>> TaskSupervisor::log(const std::string& job_id, int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return not_found_error("logs: no job {} on node {}", job_id, options_.node_id);
  auto task = job->second.find(rank);
  if (task == job->second.end()) {
    return not_found_error("logs: job {} has no rank {} on node {}", job_id, rank, options_.node_id);
  }
  return task->second->log;
}

Status TaskSupervisor::read_log_files(const std::string& job_id, int attempt, int rank,
                                      const LogSelection& selection,
                                      const std::function<bool(std::string_view)>& on_data) const {
  COHORT_RETURN_IF_ERROR(validate_job_id(job_id, "logs"));
  if (attempt < 0) return invalid_argument_error("logs of job {}: attempt {} is negative", job_id, attempt);
  const std::string name = fmt::format("rank-{}.log", rank);
  // Reading never creates directories: a job or attempt that never ran here is NOT_FOUND.
  const std::filesystem::path job_dir = std::filesystem::path(options_.log_dir) / job_id;
  std::error_code exists_error;
  if (!std::filesystem::is_directory(job_dir, exists_error) ||
      (attempt > 0 && !std::filesystem::is_directory(job_dir / fmt::format("attempt-{}", attempt), exists_error))) {
    return not_found_error("logs: no log directory {}{} on node {} (the job{} never ran here)", job_dir.string(),
                           attempt > 0 ? fmt::format("/attempt-{}", attempt) : "", options_.node_id,
                           attempt > 0 ? fmt::format("'s attempt {}", attempt) : "");
  }
  COHORT_ASSIGN_OR_RETURN(ConfinedDir log_root, ConfinedDir::open(options_.log_dir, kLogDirectoryMode));
  StatusOr<ConfinedDir> job_logs = log_root.subdir({job_id}, kLogDirectoryMode);
  if (!job_logs.ok()) return job_logs.status();
  if (attempt == 0) {
    // The newest attempt that has this rank's log here; jobs logged before attempts had their own
    // directories keep the rank's file in the job's directory itself.
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(job_logs->path(), ec)) {
      int n = 0;
      const std::string dir_name = entry.path().filename().string();
      if (std::sscanf(dir_name.c_str(), "attempt-%d", &n) == 1 && n > attempt &&
          std::filesystem::exists(entry.path() / name, ec)) {
        attempt = n;
      }
    }
  }
  if (attempt == 0) return agent::read_log_files(*job_logs, name, selection, on_data);
  COHORT_ASSIGN_OR_RETURN(ConfinedDir attempt_logs,
                          job_logs->subdir({fmt::format("attempt-{}", attempt)}, kLogDirectoryMode));
  Status read = agent::read_log_files(attempt_logs, name, selection, on_data);
  struct stat marker {};
  if (read.code() == StatusCode::kNotFound &&
      ::fstatat(attempt_logs.fd(), kLogsRemovedMarker, &marker, AT_SYMLINK_NOFOLLOW) == 0) {
    // The job's cap (every attempt together) made room for a newer attempt with this one's files.
    return not_found_error(
        "logs: rank {} of job {} attempt {} on node {} has no logs any more: they were removed to keep the "
        "job's rank logs on this node within max_log_bytes_per_job ({} bytes), oldest attempts first; newer "
        "attempts' logs are kept (cohort logs {} without --attempt shows the newest)",
        rank, job_id, attempt, options_.node_id, options_.max_log_bytes_per_job, job_id);
  }
  return read;
}

StatusOr<std::vector<TaskInfo>> TaskSupervisor::tasks(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return not_found_error("tasks: no job {} on node {}", job_id, options_.node_id);
  std::vector<TaskInfo> result;
  for (const auto& [rank, task] : job->second) {
    result.push_back(TaskInfo{rank, task->process->pid(), task->exit, task->log->path(), task->hang_detail,
                              task->process->cgroup_path()});
  }
  return result;
}

int TaskSupervisor::running_tasks() const {
  std::lock_guard<std::mutex> lock(mu_);
  int running = 0;
  for (const auto& [job_id, job] : jobs_) {
    for (const auto& [rank, task] : job) running += task->exit.has_value() ? 0 : 1;
  }
  return running;
}

std::vector<std::string> TaskSupervisor::jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> ids;
  for (const auto& item : jobs_) ids.push_back(item.first);
  return ids;
}

std::vector<std::string> TaskSupervisor::running_jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> ids;
  for (const auto& [job_id, job] : jobs_) {
    for (const auto& [rank, task] : job) {
      if (!task->exit.has_value()) {
        ids.push_back(job_id);
        break;
      }
    }
  }
  return ids;
}

Status TaskSupervisor::forget(const std::string& job_id) {
  Job forgotten;  // destroyed after the lock is released: handles join their reader threads
  std::lock_guard<std::mutex> lock(mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return not_found_error("forget: no job {} on node {}", job_id, options_.node_id);
  for (const auto& [rank, task] : job->second) {
    if (!task->exit.has_value()) {
      return failed_precondition_error("forget job {}: rank {} still runs; stop the job first", job_id, rank);
    }
  }
  forgotten = std::move(job->second);
  jobs_.erase(job);
  return ok_status();
}

}  // namespace cohort::agent
