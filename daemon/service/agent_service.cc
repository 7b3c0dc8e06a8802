#include "daemon/service/agent_service.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "daemon/agent/confined_dir.h"
#include "daemon/agent/executable_path.h"
#include "daemon/agent/free_port.h"
#include "daemon/agent/job_id.h"
#include "daemon/agent/node_inventory.h"
#include "daemon/coordinator/job_spec_validation.h"
#include "daemon/service/grpc_status.h"
#include "worker/base/path_confinement.h"

namespace cohort::daemon {
namespace {

// Writes the attempt's spec where its workers read it (COHORT_JOB_SPEC); returns the path.
// Written once per attempt, before any of its tasks starts, so no worker sees a partial file: a
// temporary file with a unique name, renamed over the old one (a restart's straggler may still
// read it). No link below spec_dir is followed; the file belongs to the job's user, mode 0400.
StatusOr<std::string> write_job_spec(const std::string& spec_dir, const cohort::v1::LaunchTasksRequest& request,
                                     const std::optional<agent::UnixUser>& run_as) {
  auto fail = [&](const Status& status) {
    return status.with_context(fmt::format("writing job {}'s spec under {}", request.job_id(), spec_dir));
  };
  StatusOr<agent::ConfinedDir> root = agent::ConfinedDir::open(spec_dir, agent::kLogDirectoryMode);
  if (!root.ok()) return fail(root.status());
  StatusOr<agent::ConfinedDir> dir =
      root->subdir({request.job_id(), fmt::format("attempt-{}", request.attempt())}, agent::kLogDirectoryMode);
  if (!dir.ok()) return fail(dir.status());
  std::string bytes;
  if (!request.spec().SerializeToString(&bytes)) {
    return internal_error("cannot serialize job {}'s spec", request.job_id());
  }
  std::optional<agent::FileOwner> owner;
  if (run_as.has_value()) owner = agent::FileOwner{run_as->uid, run_as->gid};
  Status written = dir->write_file_atomically(kJobSpecFileName, bytes, kJobSpecFileMode, owner);
  if (!written.ok()) return fail(written);
  return dir->path() + "/" + kJobSpecFileName;
}

// The program a rank runs: the job's own command (found along the PATH the ranks will see, and
// checked against this agent's allowed_commands), else cohort-worker.
StatusOr<std::vector<std::string>> rank_argv(const cohort::v1::LaunchTasksRequest& request,
                                             const AgentServiceOptions& options,
                                             const std::optional<agent::UnixUser>& run_as) {
  const cohort::v1::JobSpec& spec = request.spec();
  // Graph jobs too: cohort-worker would load a spec's LD_PRELOAD as readily as any program.
  std::vector<std::string> env_names;
  for (const auto& [name, value] : spec.env()) env_names.push_back(name);
  COHORT_RETURN_IF_ERROR(coordinator::check_env_under_allowed_commands(
      env_names, options.allowed_commands, fmt::format("LaunchTasks for job '{}': env", request.job_id())));
  if (spec.command_size() == 0) {
    if (options.worker_command.empty()) {
      return failed_precondition_error("LaunchTasks for job '{}': this agent has no worker command configured",
                                       request.job_id());
    }
    return options.worker_command;
  }
  std::vector<std::string> argv(spec.command().begin(), spec.command().end());
  if (!options.allowed_commands.empty() &&
      std::find(options.allowed_commands.begin(), options.allowed_commands.end(), argv[0]) ==
          options.allowed_commands.end()) {
    return permission_denied_error(
        "LaunchTasks for job '{}': command[0] {:?} is not in node {}'s allowed_commands ({}); ask an admin to "
        "add it to this node's cohortd config",
        request.job_id(), argv[0], options.node_id, fmt::join(options.allowed_commands, ", "));
  }
  std::string search_path = agent::kDefaultSearchPath;
  if (auto it = spec.env().find("PATH"); it != spec.env().end()) {
    search_path = it->second;
  } else if (const char* own = std::getenv("PATH"); own != nullptr && *own != '\0') {
    search_path = own;
  }
  std::optional<agent::SearchIdentity> as;
  if (run_as.has_value()) as = agent::SearchIdentity{run_as->uid, run_as->gid};
  StatusOr<std::string> program = agent::find_executable(argv[0], search_path, as);
  if (!program.ok()) {
    return program.status().with_context(fmt::format("LaunchTasks for job '{}' on node {}", request.job_id(),
                                                     options.node_id));
  }
  argv[0] = *program;
  return argv;
}

// Where the jobs' own directories go: job_dir_root, else <parent of spec_dir>/jobs.
std::string job_dir_root_of(const AgentServiceOptions& options) {
  return options.job_dir_root.empty() ? (std::filesystem::path(options.spec_dir).parent_path() / "jobs").string()
                                      : options.job_dir_root;
}

// The agent's data directory, which holds the job directories' root (cohortd: <data_dir>/jobs).
std::string agent_data_dir_of(const AgentServiceOptions& options) {
  std::filesystem::path root(job_dir_root_of(options));
  if (!root.has_filename()) root = root.parent_path();  // "<data_dir>/jobs/"
  return root.parent_path().string();
}

}  // namespace

AgentService::AgentService(agent::TaskSupervisor* supervisor, AgentServiceOptions options)
    : supervisor_(supervisor),
      options_(std::move(options)),
      job_user_holder_(agent_data_dir_of(options_), options_.job_user, options_.shared_job_user) {}

Status AgentService::launch(const cohort::v1::LaunchTasksRequest& request,
                            cohort::v1::LaunchTasksResponse* response) {
  COHORT_RETURN_IF_ERROR(agent::validate_job_id(request.job_id(), "LaunchTasks"));
  if (request.tasks_size() == 0)
    return invalid_argument_error("LaunchTasks for job '{}': no tasks given", request.job_id());
  agent::JobTasks job;
  job.job_id = request.job_id();
  job.attempt = request.attempt();  // each attempt logs to its own directory
  // Never as root: the owner's mapped user, else the job user (or, in a single-user daemon, the
  // agent's own user when the agent is not root and cannot switch).
  agent::JobUserOptions job_user_options;
  job_user_options.job_user = options_.job_user;
  job_user_options.user_map = options_.user_map;
  job_user_options.run_jobs_as_daemon_user = options_.run_jobs_as_daemon_user;
  job_user_options.data_dir = agent_data_dir_of(options_);
  StatusOr<std::optional<agent::UnixUser>> run_as = agent::unix_user_for_job(request.owner(), job_user_options);
  if (!run_as.ok()) {
    return run_as.status().with_context(
        fmt::format("LaunchTasks for job '{}' on node {}", request.job_id(), options_.node_id));
  }
  job.run_as = std::move(run_as).value();
  COHORT_ASSIGN_OR_RETURN(job.argv, rank_argv(request, options_, job.run_as));
  job.world_size = request.world_size();
  job.master_addr = request.master_address();
  for (const cohort::v1::Task& task : request.tasks()) {
    if (task.rank() < 0 || task.rank() >= request.world_size()) {
      return invalid_argument_error("LaunchTasks for job '{}': rank {} is outside the world of {} ranks",
                                    request.job_id(), task.rank(), request.world_size());
    }
    job.ranks.push_back(task.rank());
  }
  if (request.attempt() < 1) {
    return invalid_argument_error("LaunchTasks for job '{}': attempt is {}; attempts are numbered from 1",
                                  request.job_id(), request.attempt());
  }
  if (request.coordinator_address().empty() && options_.coordinator_address.empty()) {
    return invalid_argument_error(
        "LaunchTasks for job '{}': coordinator_address is empty and this agent has none configured",
        request.job_id());
  }
  if (request.master_port() > 0) {
    job.master_port = request.master_port();
  } else {
    // An older coordinator sends none: a port free here is right for a one-node attempt.
    COHORT_ASSIGN_OR_RETURN(job.master_port, agent::pick_free_port());
  }
  // The agent's own route to the coordinator wins: the coordinator only knows the address it
  // listens on, which may be 0.0.0.0 or a name this node cannot resolve.
  const std::string& coordinator =
      options_.coordinator_address.empty() ? request.coordinator_address() : options_.coordinator_address;
  // The spec's own variables first: cohort's launch environment below wins (submit refuses
  // specs that set those names, so this only matters for an older coordinator).
  for (const auto& [name, value] : request.spec().env()) job.env[name] = value;
  job.env["COHORT_COORDINATOR"] = coordinator;
  job.env["COHORT_ATTEMPT"] = std::to_string(request.attempt());
  job.env["COHORT_NODE_RANK"] = std::to_string(request.node_rank());
  // torchrun's names for the same number.
  job.env["NODE_RANK"] = std::to_string(request.node_rank());
  job.env["GROUP_RANK"] = std::to_string(request.node_rank());
  job.env["COHORT_NUM_NODES"] = std::to_string(request.num_nodes());
  // A graph job resumes from its checkpoint only when its spec says so; a command job's own code
  // decides what a restart resumes, so it is told on every attempt after the first.
  const bool command_job = request.spec().command_size() > 0;
  if (request.attempt() > 1 && (command_job || request.spec().restart_policy().from_checkpoint()))
    job.env["COHORT_RESUME"] = "1";
  for (const cohort::v1::Task& task : request.tasks()) {
    std::map<std::string, std::string>& env = job.rank_env[task.rank()];
    env["COHORT_INIT"] = fmt::format("cohort://{}/{}?attempt={}&local_rank={}", coordinator, request.job_id(),
                                     request.attempt(), task.local_rank());
    // A rank sees exactly the GPUs placed for it: none for a CPU job, so it never creates a CUDA
    // context (hundreds of MB) on a GPU another job was given.
    env["CUDA_VISIBLE_DEVICES"] = fmt::format("{}", fmt::join(task.gpus(), ","));
  }

  if (options_.spec_dir.empty()) {
    return failed_precondition_error("LaunchTasks for job '{}': this agent has no directory for job specs",
                                     request.job_id());
  }
  // The slot check and the reservation happen under one lock so two launches cannot both fit; the
  // rest runs without it (a working_dir or command on a hung mount blocks there, and StopTasks and
  // attempt_of, which the daemon's exit reports and so its heartbeats wait on, must not wait too).
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) {
      return unavailable_error("LaunchTasks for job '{}': node {} is draining (its cohortd is stopping)",
                               request.job_id(), options_.node_id);
    }
    if (auto pending = launching_.find(job.job_id); pending != launching_.end()) {
      return already_exists_error("LaunchTasks for job '{}': attempt {} of it is being launched on node {}",
                                  request.job_id(), pending->second.attempt, options_.node_id);
    }
    if (reported_stops_.count(job.job_id) != 0) {
      // stop_reported stops the job's tasks by job id: a launch ending meanwhile would be stopped in
      // their place. The supervisor answers the same while those tasks still run.
      return already_exists_error(
          "LaunchTasks for job '{}' attempt {}: node {} is stopping the job's earlier tasks (the coordinator's "
          "heartbeat reply ordered it); launch it again once they ended",
          request.job_id(), request.attempt(), options_.node_id);
    }
    // A launch that just ended may still be counted twice here (running and reserved) for an
    // instant: that errs toward refusing, which the coordinator retries, never toward overbooking.
    int reserved = 0;
    for (const auto& [job_id, pending] : launching_) reserved += pending.tasks;
    const int free_slots = options_.slots - supervisor_->running_tasks() - reserved;
    if (request.tasks_size() > free_slots) {
      return resource_exhausted_error("LaunchTasks for job '{}': {} tasks do not fit the {} free of {} slots",
                                      request.job_id(), request.tasks_size(), std::max(free_slots, 0),
                                      options_.slots);
    }
    launching_[job.job_id] = PendingLaunch{request.attempt(), request.tasks_size(), false};
  }
  Status launched = launch_reserved(request, &job);
  bool stop_requested = false;
  bool draining = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto pending = launching_.find(job.job_id);
    stop_requested = pending->second.stop_requested;
    // A drain that began meanwhile listed the running jobs without this one (and may be past its
    // stops already): its tasks must not be left to run on a stopping node.
    draining = draining_;
    launching_.erase(pending);
    launch_ended_.notify_all();
    if (launched.ok()) attempts_[job.job_id] = Launched{request.attempt(), next_launch_++};
  }
  if (!launched.ok()) return launched;
  if (stop_requested || draining) {
    // A stop: the coordinator was told they would be stopped (StopTasks answered, or fencing, while
    // this launch ran). A drain: the launch fails below, so the attempt is placed elsewhere.
    spdlog::info("agent: job {} attempt {} was {} while it launched; stopping its tasks", job.job_id,
                 request.attempt(), stop_requested ? "stopped" : "drained");
    if (Status stopped = supervisor_->stop(job.job_id); !stopped.ok()) {
      spdlog::warn("agent: stopping job {} after its launch: {}", job.job_id, stopped.to_string());
    }
    if (!stop_requested) {
      return unavailable_error(
          "LaunchTasks for job '{}' attempt {}: node {} began draining (its cohortd is stopping) while the "
          "launch ran; its tasks were stopped",
          request.job_id(), request.attempt(), options_.node_id);
    }
  }
  StatusOr<std::vector<agent::TaskInfo>> tasks = supervisor_->tasks(job.job_id);
  if (tasks.ok()) {
    for (const cohort::v1::Task& task : request.tasks()) {
      for (const agent::TaskInfo& info : *tasks) {
        if (info.rank == task.rank()) response->add_pids(info.pid);
      }
    }
  }
  return Status();
}

Status AgentService::launch_reserved(const cohort::v1::LaunchTasksRequest& request, agent::JobTasks* job) {
  // The shared job_user serves one owner per node unless the operator opted in: its ranks could
  // read another owner's secrets and files, and signal or trace their ranks. Claimed before the
  // job's directory is made, so a refused owner leaves nothing behind owned by job_user.
  if (job->run_as.has_value() && job->run_as->name == options_.job_user) {
    COHORT_RETURN_IF_ERROR(job_user_holder_.claim(request.owner())
                               .with_context(fmt::format("LaunchTasks for job '{}' on node {}", request.job_id(),
                                                         options_.node_id)));
  }
  COHORT_ASSIGN_OR_RETURN(const std::string job_dir, make_job_dir(job->job_id, job->run_as));
  job->env["COHORT_JOB_DIR"] = job_dir;
  // The ranks' user may write there (the supervisor watches the files for hang detection).
  job->heartbeat_dir = job_dir;
  job->env["COHORT_ALLOWED_PATH_ROOTS"] = fmt::format("{}", fmt::join(options_.allowed_path_roots, ":"));
  // Relative paths a rank writes land in its own directory, which its user may write; a spec's
  // working_dir is confined like its other paths, symlinks resolved.
  job->working_dir = job_dir;
  if (!request.spec().working_dir().empty()) {
    COHORT_ASSIGN_OR_RETURN(job->working_dir, working_dir_for(request.spec().working_dir(), job_dir, job->run_as));
  }
  if (!request.job_secret().empty()) job->env["COHORT_JOB_SECRET"] = request.job_secret();
  if (!options_.ca_certificate_pem.empty()) job->env["COHORT_CA_CERTIFICATE"] = options_.ca_certificate_pem;
  COHORT_ASSIGN_OR_RETURN(const std::string spec_path, write_job_spec(options_.spec_dir, request, job->run_as));
  job->env["COHORT_JOB_SPEC"] = spec_path;
  return supervisor_->launch(*job);
}

StatusOr<std::string> AgentService::working_dir_for(const std::string& working_dir, const std::string& job_dir,
                                                   const std::optional<agent::UnixUser>& run_as) const {
  PathConfinement confinement;
  confinement.job_dir = job_dir;
  confinement.roots = options_.allowed_path_roots;
  COHORT_ASSIGN_OR_RETURN(const std::string confined, confine_path("working_dir", working_dir, confinement));
  if (!path_is_within(confined, job_dir)) {
    // Under an allowed root: it must exist already (the agent creates nothing outside job
    // directories); the rank's chdir, as the job's user, checks that it may enter it.
    return confined;
  }
  // Inside the job's directory: made on the first launch, component by component with no link
  // followed, each owned by the job's user so the rank can enter and write it.
  auto fail = [&](const Status& status) {
    return status.with_context(fmt::format("creating working_dir {:?} under {}", working_dir, job_dir));
  };
  StatusOr<agent::ConfinedDir> dir = agent::ConfinedDir::open(job_dir, kJobDirMode);
  if (!dir.ok()) return fail(dir.status());
  const std::string relative = confined.size() > job_dir.size() ? confined.substr(job_dir.size() + 1) : "";
  std::istringstream components(relative);
  for (std::string component; std::getline(components, component, '/');) {
    if (component.empty()) continue;
    StatusOr<agent::ConfinedDir> next = dir->subdir({component}, kJobDirMode);
    if (!next.ok()) return fail(next.status());
    if (run_as.has_value()) {
      if (Status owned = next->set_owner(agent::FileOwner{run_as->uid, run_as->gid}); !owned.ok()) return fail(owned);
    }
    dir = std::move(next);
  }
  return confined;
}

StatusOr<std::string> AgentService::make_job_dir(const std::string& job_id,
                                               const std::optional<agent::UnixUser>& run_as) const {
  const std::string root_path = job_dir_root_of(options_);
  auto fail = [&](const Status& status) {
    return status.with_context(fmt::format("creating job {}'s directory under {}", job_id, root_path));
  };
  StatusOr<agent::ConfinedDir> root = agent::ConfinedDir::open(root_path, kJobDirRootMode);
  if (!root.ok()) return fail(root.status());
  StatusOr<agent::ConfinedDir> dir = root->subdir({job_id}, kJobDirMode);
  if (!dir.ok()) return fail(dir.status());
  if (run_as.has_value()) {
    Status owned = dir->set_owner(agent::FileOwner{run_as->uid, run_as->gid});
    if (!owned.ok()) return fail(owned);
  }
  // Marks it in use: the supervisor deletes job directories quiet for job_retention, and a new
  // attempt of a job quiet that long is not running yet while it launches.
  if (::futimens(dir->fd(), nullptr) != 0) {
    spdlog::warn("agent: futimens({}): {}; the job directory retention may take it for quiet", dir->path(),
                 std::strerror(errno));
  }
  return dir->path();
}

grpc::Status AgentService::LaunchTasks(grpc::ServerContext* /*context*/,
                                       const cohort::v1::LaunchTasksRequest* request,
                                       cohort::v1::LaunchTasksResponse* response) {
  return to_grpc_status(launch(*request, response));
}

grpc::Status AgentService::StopTasks(grpc::ServerContext* /*context*/,
                                     const cohort::v1::StopTasksRequest* request,
                                     cohort::v1::StopTasksResponse* response) {
  if (Status id = agent::validate_job_id(request->job_id(), "StopTasks"); !id.ok()) return to_grpc_status(id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto pending = launching_.find(request->job_id()); pending != launching_.end()) {
      if (request->attempt() > 0 && request->attempt() != pending->second.attempt) {
        // Until the launch ends it is not known whether the tasks the supervisor holds are the
        // other attempt's or the new one's; the daemon sends a stop that was not taken again.
        return to_grpc_status(unavailable_error(
            "StopTasks for job '{}' attempt {}: attempt {} of it is being launched on node {}; send the stop again",
            request->job_id(), request->attempt(), pending->second.attempt, options_.node_id));
      }
      // Waiting for the launch could take as long as a slow filesystem holds it; the launch stops
      // the tasks as soon as they started, and their exits are reported as stopped.
      pending->second.stop_requested = true;
      response->set_signalled(pending->second.tasks);
      return grpc::Status::OK;
    }
  }
  // The supervisor keys tasks by job: a stop for another attempt than the one running here (a late
  // order, or fencing of an old attempt) must not stop the current one.
  if (std::optional<int> attempt = attempt_of(request->job_id());
      request->attempt() > 0 && attempt.has_value() && *attempt != request->attempt()) {
    response->set_signalled(0);
    return grpc::Status::OK;
  }
  StatusOr<int> signalled = stop_job(request->job_id());
  if (!signalled.ok()) return to_grpc_status(signalled.status());
  response->set_signalled(*signalled);
  return grpc::Status::OK;
}

StatusOr<int> AgentService::stop_job(const std::string& job_id) {
  COHORT_ASSIGN_OR_RETURN(std::vector<agent::TaskInfo> tasks, supervisor_->tasks(job_id));
  int running = 0;
  for (const agent::TaskInfo& task : tasks) running += task.exit.has_value() ? 0 : 1;
  COHORT_RETURN_IF_ERROR(supervisor_->stop(job_id));
  return running;
}

std::vector<AgentService::RunningLaunch> AgentService::running_launches() const {
  std::map<std::string, Launched> launched;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [job_id, launch] : attempts_) {
      if (launching_.count(job_id) == 0) launched.emplace(job_id, launch);
    }
  }
  std::vector<RunningLaunch> running;
  for (const std::string& job_id : supervisor_->running_jobs()) {
    auto it = launched.find(job_id);
    if (it == launched.end()) continue;  // being launched, or started by no LaunchTasks of this service
    StatusOr<std::vector<agent::TaskInfo>> tasks = supervisor_->tasks(job_id);
    if (!tasks.ok()) continue;  // forgotten meanwhile
    RunningLaunch attempt{job_id, it->second.attempt, it->second.launch, {}};
    for (const agent::TaskInfo& task : *tasks) {
      if (!task.exit.has_value()) attempt.ranks.push_back(task.rank);
    }
    if (!attempt.ranks.empty()) running.push_back(std::move(attempt));
  }
  // A launch that began and ended while the tasks were read may have replaced them: its tasks must
  // not be reported as the launch read before (its attempt may differ).
  std::lock_guard<std::mutex> lock(mu_);
  running.erase(std::remove_if(running.begin(), running.end(),
                               [this](const RunningLaunch& attempt) {
                                 auto it = attempts_.find(attempt.job_id);
                                 return launching_.count(attempt.job_id) != 0 || it == attempts_.end() ||
                                        it->second.launch != attempt.launch;
                               }),
                running.end());
  return running;
}

StatusOr<int> AgentService::stop_reported(const std::string& job_id, int attempt, uint64_t launch,
                                          const std::string& reason) {
  COHORT_RETURN_IF_ERROR(agent::validate_job_id(job_id, "a heartbeat's stop"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = attempts_.find(job_id);
    if (launching_.count(job_id) != 0 || it == attempts_.end() || it->second.attempt != attempt ||
        it->second.launch != launch) {
      // What the heartbeat reported is gone already; the launch since is the coordinator's to judge
      // at the next heartbeat.
      spdlog::info("agent: the coordinator's stop of job {} attempt {} on node {} is not carried out: the tasks "
                   "it was about have been replaced by another launch ({})",
                   job_id, attempt, options_.node_id, reason);
      return 0;
    }
    // From here until the stop is done, a launch of the job is refused (launch()): the supervisor
    // refuses one only while these tasks run, and one that began and ended after they all exited by
    // themselves would otherwise be the one stopped.
    ++reported_stops_[job_id];
  }
  const auto unmark = [this, &job_id] {
    std::lock_guard<std::mutex> lock(mu_);
    if (--reported_stops_[job_id] <= 0) reported_stops_.erase(job_id);
  };
  if (options_.reported_stop_checked) options_.reported_stop_checked(job_id);
  StatusOr<int> stopped = stop_job(job_id);
  unmark();
  COHORT_ASSIGN_OR_RETURN(int signalled, std::move(stopped));
  if (signalled > 0) {
    spdlog::info("agent: stopped {} task(s) of job {} attempt {} on node {} on the coordinator's heartbeat reply: {}",
                 signalled, job_id, attempt, options_.node_id, reason);
  }
  return signalled;
}

grpc::Status AgentService::StreamLogs(grpc::ServerContext* context,
                                      const cohort::v1::StreamLogsRequest* request,
                                      grpc::ServerWriter<cohort::v1::LogChunk>* writer) {
  if (request->stream() != cohort::v1::BOTH) {
    return to_grpc_status(invalid_argument_error(
        "StreamLogs for job '{}' rank {}: only stream BOTH is captured (stdout and stderr interleaved)",
        request->job_id(), request->rank()));
  }
  if (Status id = agent::validate_job_id(request->job_id(), "StreamLogs"); !id.ok()) return to_grpc_status(id);
  if (request->attempt() < 0 || request->tail_lines() < 0 || request->since_unix_ms() < 0) {
    return to_grpc_status(invalid_argument_error(
        "StreamLogs for job '{}' rank {}: attempt {}, tail_lines {} and since_unix_ms {} must be >= 0",
        request->job_id(), request->rank(), request->attempt(), request->tail_lines(), request->since_unix_ms()));
  }
  const agent::LogSelection selection{request->tail_lines(), request->since_unix_ms()};
  StatusOr<std::shared_ptr<agent::LogCapture>> capture = supervisor_->log(request->job_id(), request->rank());
  if (!capture.ok() && capture.status().code() != StatusCode::kNotFound) return to_grpc_status(capture.status());
  const std::optional<int> live_attempt = attempt_of(request->job_id());
  const bool in_memory =
      capture.ok() && (request->attempt() == 0 || (live_attempt && *live_attempt == request->attempt()));
  if (!in_memory) {
    // An older attempt, or a job this agent no longer holds (it restarted, or forgot the job):
    // the rank's files on disk have it; there is nothing to follow.
    int64_t offset = 0;
    bool client_left = false;
    Status read = supervisor_->read_log_files(
        request->job_id(), request->attempt(), request->rank(), selection, [&](std::string_view bytes) {
          cohort::v1::LogChunk out;
          out.set_rank(request->rank());
          out.set_stream(cohort::v1::BOTH);
          out.set_data(std::string(bytes));
          out.set_offset(offset);
          offset += static_cast<int64_t>(bytes.size());
          client_left = context->IsCancelled() || !writer->Write(out);
          return !client_left;
        });
    return client_left ? grpc::Status::OK : to_grpc_status(read);
  }
  // Without a selection, from 0: a reader then learns (skipped, log_path) what the ring dropped.
  const bool selected = selection.tail_lines > 0 || selection.since_unix_ms > 0;
  uint64_t offset = selected ? (*capture)->start_of(selection) : 0;
  while (!context->IsCancelled()) {
    agent::LogChunk chunk = request->follow() ? (*capture)->wait_and_read_from(offset, kLogFollowPollInterval)
                                              : (*capture)->read_from(offset);
    if (!chunk.data.empty()) {
      cohort::v1::LogChunk out;
      out.set_rank(request->rank());
      out.set_stream(cohort::v1::BOTH);
      out.set_data(std::move(chunk.data));
      out.set_offset(static_cast<int64_t>(chunk.offset));
      if (chunk.skipped > 0) out.set_log_path((*capture)->path());
      if (!writer->Write(out)) return grpc::Status::OK;  // the client left
    }
    offset = chunk.next_offset;
    if (!request->follow() || (chunk.closed && offset >= (*capture)->size())) return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "StreamLogs: the client cancelled");
}

StatusOr<cohort::v1::NodeInfo> AgentService::describe_node() const {
  COHORT_ASSIGN_OR_RETURN(agent::NodeInventory inventory, agent::probe_node_inventory());
  cohort::v1::NodeInfo node;
  node.set_node_id(options_.node_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    node.set_address(options_.address);
  }
  node.set_hostname(inventory.hostname);
  node.set_cores(inventory.cores);
  node.set_memory_bytes(inventory.memory_bytes);
  for (const agent::GpuDevice& gpu : inventory.gpus) {
    cohort::v1::Gpu* out = node.add_gpus();
    out->set_index(gpu.index);
    out->set_model(gpu.model);
    out->set_memory_bytes(gpu.memory_bytes);
  }
  node.set_slots(options_.slots);
  const int free_slots = options_.slots - supervisor_->running_tasks();
  node.set_free_slots(free_slots > 0 ? free_slots : 0);
  return node;
}

grpc::Status AgentService::NodeInfo(grpc::ServerContext* /*context*/,
                                    const cohort::v1::NodeInfoRequest* /*request*/,
                                    cohort::v1::NodeInfo* response) {
  StatusOr<cohort::v1::NodeInfo> node = describe_node();
  if (!node.ok()) return to_grpc_status(node.status());
  *response = std::move(node).value();
  return grpc::Status::OK;
}

void AgentService::start_draining() {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  if (!launch_ended_.wait_for(lock, options_.drain_launch_wait, [this] { return launching_.empty(); })) {
    spdlog::warn("agent: draining node {}: {} launch(es) still under way after {} ms (a hung filesystem?); "
                 "their tasks stop as soon as they started",
                 options_.node_id, launching_.size(), options_.drain_launch_wait.count());
  }
}

std::vector<std::pair<std::string, int>> AgentService::stop_launches_in_progress() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, int>> stopped;
  for (auto& [job_id, pending] : launching_) {
    pending.stop_requested = true;
    stopped.emplace_back(job_id, pending.attempt);
  }
  return stopped;
}

void AgentService::set_address(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  options_.address = address;
}

std::optional<int> AgentService::attempt_of(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = attempts_.find(job_id);
  if (it == attempts_.end()) return std::nullopt;
  return it->second.attempt;
}

}  // namespace cohort::daemon
