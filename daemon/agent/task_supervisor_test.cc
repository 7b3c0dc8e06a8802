#include "daemon/agent/task_supervisor.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

using namespace std::chrono_literals;
using testing::TempDir;
using testing::wait_until;

// Records every exit the supervisor reports.
class ExitRecorder {
 public:
  TaskExitCallback callback() {
    return [this](const TaskExit& exit) {
      std::lock_guard<std::mutex> lock(mu_);
      exits_.push_back(exit);
    };
  }
  std::vector<TaskExit> exits() const {
    std::lock_guard<std::mutex> lock(mu_);
    return exits_;
  }
  bool wait_for(size_t count) {
    return wait_until([&] { return exits().size() >= count; });
  }

 private:
  mutable std::mutex mu_;
  std::vector<TaskExit> exits_;
};

JobTasks shell_job(const std::string& job_id, const std::string& script, int world_size = 1) {
  JobTasks job;
  job.job_id = job_id;
  job.argv = {"/bin/sh", "-c", script};
  job.world_size = world_size;
  for (int rank = 0; rank < world_size; ++rank) job.ranks.push_back(rank);
  job.master_addr = "127.0.0.1";
  job.master_port = 29500;
  return job;
}

class TaskSupervisorTest : public ::testing::Test {
 protected:
  TaskSupervisorOptions options(Duration grace = 5s) {
    TaskSupervisorOptions options;
    options.log_dir = dir_.path() + "/logs";
    options.node_id = "node-a";
    options.coordinator_address = "127.0.0.1:7070";
    options.stop_grace_period = grace;
    options.exit_poll_interval = 10ms;
    return options;
  }
  std::string log_text(TaskSupervisor& supervisor, const std::string& job_id, int rank) {
    auto log = supervisor.log(job_id, rank);
    return log.ok() ? (*log)->tail(kLogRingBufferBytes) : log.status().to_string();
  }

  TempDir dir_;
  PosixProcessLauncher launcher_;
  ExitRecorder recorder_;
};

TEST_F(TaskSupervisorTest, ReportsExitCodeAndCapturesBothStreams) {
  TaskSupervisor supervisor(options(), &launcher_, recorder_.callback());
  ASSERT_TRUE(supervisor.launch(shell_job("job-1", "echo out; echo err 1>&2; exit 3")).ok());
  ASSERT_TRUE(recorder_.wait_for(1));
  std::vector<TaskExit> exits = recorder_.exits();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].job_id, "job-1");
  EXPECT_EQ(exits[0].rank, 0);
  EXPECT_EQ(exits[0].status, (ExitStatus{3, 0}));
  EXPECT_FALSE(exits[0].stopped);

  // Reported only after the output was drained: both lines are there already.
  std::string ring = log_text(supervisor, "job-1", 0);
  EXPECT_NE(ring.find("out\n"), std::string::npos) << ring;
  EXPECT_NE(ring.find("err\n"), std::string::npos) << ring;
  std::string file = testing::read_file(dir_.path() + "/logs/job-1/rank-0.log");
  EXPECT_EQ(file, ring);
  EXPECT_TRUE((*supervisor.log("job-1", 0))->read_from(0).closed);

  auto tasks = supervisor.tasks("job-1");
  ASSERT_TRUE(tasks.ok());
  ASSERT_EQ(tasks->size(), 1u);
  EXPECT_EQ((*tasks)[0].exit, (std::optional<ExitStatus>(ExitStatus{3, 0})));
  EXPECT_EQ(supervisor.running_tasks(), 0);
}

TEST_F(TaskSupervisorTest, EnvironmentReachesEachRank) {
  TaskSupervisor supervisor(options(), &launcher_, recorder_.callback());
  JobTasks job = shell_job("job-env",
                           "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
                           "$COHORT_JOB_ID $COHORT_NODE_ID $COHORT_COORDINATOR $EXTRA\"");
  job.world_size = 6;
  job.ranks = {2, 5};
  job.master_addr = "10.0.0.1";
  job.env = {{"EXTRA", "extra value"}, {"RANK", "overridden by cohort"}};
  ASSERT_TRUE(supervisor.launch(job).ok());
  ASSERT_TRUE(recorder_.wait_for(2));
  EXPECT_EQ(log_text(supervisor, "job-env", 2),
            "2 6 0 2 10.0.0.1 29500 job-env node-a 127.0.0.1:7070 extra value\n");
  EXPECT_EQ(log_text(supervisor, "job-env", 5),
            "5 6 1 2 10.0.0.1 29500 job-env node-a 127.0.0.1:7070 extra value\n");
}

// Ranks sharing a node get their share of its CPUs as OMP_NUM_THREADS (as torchrun sets 1), unless
// the job or the agent's environment sets it; a lone rank is left alone.
TEST_F(TaskSupervisorTest, RanksSharingANodeGetTheirShareOfItsCpusAsOmpNumThreads) {
  TaskSupervisorOptions opts = options();
  opts.inherit_environment = false;  // the test's own environment may set OMP_NUM_THREADS
  opts.cpu_count = 8;
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  const std::string print = "echo \"[${OMP_NUM_THREADS-unset}]\"";
  JobTasks three = shell_job("job-three", print);
  three.world_size = 3;
  three.ranks = {0, 1, 2};
  ASSERT_TRUE(supervisor.launch(three).ok());
  JobTasks many = shell_job("job-many", print);
  many.world_size = 12;
  many.ranks = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // more ranks than CPUs: one thread each
  ASSERT_TRUE(supervisor.launch(many).ok());
  JobTasks set = shell_job("job-set", print);
  set.world_size = 2;
  set.ranks = {0, 1};
  set.env = {{"OMP_NUM_THREADS", "3"}};
  ASSERT_TRUE(supervisor.launch(set).ok());
  JobTasks alone = shell_job("job-alone", print);
  ASSERT_TRUE(supervisor.launch(alone).ok());
  ASSERT_TRUE(recorder_.wait_for(3 + 12 + 2 + 1));
  EXPECT_EQ(log_text(supervisor, "job-three", 2), "[2]\n");
  EXPECT_EQ(log_text(supervisor, "job-many", 11), "[1]\n");
  EXPECT_EQ(log_text(supervisor, "job-set", 1), "[3]\n");
  EXPECT_EQ(log_text(supervisor, "job-alone", 0), "[unset]\n");
}

// With slots for other jobs' ranks, a rank's share is the CPUs over the slots, even alone.
TEST_F(TaskSupervisorTest, TheSlotsBoundARanksShareOfTheCpus) {
  TaskSupervisorOptions opts = options();
  opts.inherit_environment = false;
  opts.cpu_count = 8;
  opts.slots = 4;
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  ASSERT_TRUE(supervisor.launch(shell_job("job-one-of-four", "echo \"[${OMP_NUM_THREADS-unset}]\"")).ok());
  JobTasks per_rank = shell_job("job-rank-env", "echo \"[${OMP_NUM_THREADS-unset}]\"");
  per_rank.rank_env = {{0, {{"OMP_NUM_THREADS", "7"}}}};
  ASSERT_TRUE(supervisor.launch(per_rank).ok());
  ASSERT_TRUE(recorder_.wait_for(2));
  EXPECT_EQ(log_text(supervisor, "job-one-of-four", 0), "[2]\n");
  EXPECT_EQ(log_text(supervisor, "job-rank-env", 0), "[7]\n");
}

TEST_F(TaskSupervisorTest, TheAgentsOwnOmpNumThreadsIsKept) {
  TaskSupervisorOptions opts = options();
  opts.inherit_environment = false;
  opts.base_environment = {"OMP_NUM_THREADS=5"};  // as the agent's environment would carry it
  opts.cpu_count = 8;
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  JobTasks job = shell_job("job-agent-env", "echo \"[${OMP_NUM_THREADS-unset}]\"");
  job.world_size = 2;
  job.ranks = {0, 1};
  ASSERT_TRUE(supervisor.launch(job).ok());
  ASSERT_TRUE(recorder_.wait_for(2));
  EXPECT_EQ(log_text(supervisor, "job-agent-env", 0), "[5]\n");
}

// The rank learns its heartbeat file and the interval the agent expects (task_heartbeat_interval_ms)
// together; without a heartbeat directory it gets neither.
TEST_F(TaskSupervisorTest, TheHeartbeatIntervalReachesEachRank) {
  TaskSupervisorOptions opts = options();
  opts.heartbeat_interval = 750ms;
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  JobTasks job = shell_job("job-beat", "echo \"${COHORT_HEARTBEAT_FILE##*/} ${COHORT_HEARTBEAT_INTERVAL_MS}\"");
  job.heartbeat_dir = dir_.path();
  ASSERT_TRUE(supervisor.launch(job).ok());
  JobTasks quiet = shell_job("job-quiet", "echo \"[${COHORT_HEARTBEAT_FILE-unset} ${COHORT_HEARTBEAT_INTERVAL_MS-unset}]\"");
  ASSERT_TRUE(supervisor.launch(quiet).ok());
  ASSERT_TRUE(recorder_.wait_for(2));
  EXPECT_EQ(log_text(supervisor, "job-beat", 0), "heartbeat-rank-0 750\n");
  EXPECT_EQ(log_text(supervisor, "job-quiet", 0), "[unset unset]\n");
}

TEST_F(TaskSupervisorTest, MissingBinaryIsAClearErrorAndStartsNothing) {
  TaskSupervisor supervisor(options(), &launcher_, recorder_.callback());
  JobTasks job = shell_job("job-missing", "", 2);
  job.argv = {"/nonexistent/cohort-worker"};
  Status status = supervisor.launch(job);
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_NE(status.message().find("/nonexistent/cohort-worker"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("job-missing rank 0"), std::string::npos) << status.message();
  EXPECT_EQ(supervisor.running_tasks(), 0);
  EXPECT_EQ(supervisor.tasks("job-missing").status().code(), StatusCode::kNotFound);
}

TEST_F(TaskSupervisorTest, RejectsInvalidJobsAndDuplicates) {
  TaskSupervisor supervisor(options(), &launcher_, recorder_.callback());
  JobTasks outside = shell_job("job-bad", "true", 2);
  outside.ranks = {0, 2};
  Status status = supervisor.launch(outside);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("rank 2 outside the world [0, 2)"), std::string::npos) << status.message();

  ASSERT_TRUE(supervisor.launch(shell_job("job-dup", "sleep 100")).ok());
  EXPECT_EQ(supervisor.launch(shell_job("job-dup", "sleep 100")).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(supervisor.forget("job-dup").code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(supervisor.stop("job-dup").ok());
  EXPECT_TRUE(supervisor.forget("job-dup").ok());
  EXPECT_EQ(supervisor.stop("job-dup").code(), StatusCode::kNotFound);
}

TEST_F(TaskSupervisorTest, ForgetsTheOldestEndedJobsBeyondTheLimit) {
  TaskSupervisorOptions bounded = options();
  bounded.max_finished_jobs = 2;
  TaskSupervisor supervisor(bounded, &launcher_, recorder_.callback());
  for (int i = 1; i <= 3; ++i) {
    ASSERT_TRUE(supervisor.launch(shell_job("job-" + std::to_string(i), "true")).ok());
    ASSERT_TRUE(recorder_.wait_for(static_cast<size_t>(i)));
  }
  // Three ended, limit two: launching another drops the oldest ended one only.
  ASSERT_TRUE(supervisor.launch(shell_job("job-4", "sleep 100")).ok());
  EXPECT_EQ(supervisor.tasks("job-1").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(supervisor.tasks("job-2").ok());
  EXPECT_TRUE(supervisor.tasks("job-3").ok());
  EXPECT_TRUE(supervisor.tasks("job-4").ok());
  ASSERT_TRUE(supervisor.stop("job-4").ok());
}

TEST_F(TaskSupervisorTest, StopKillsARankThatIgnoresTermAfterTheGracePeriod) {
  constexpr Duration kGrace = 300ms;
  TaskSupervisor supervisor(options(kGrace), &launcher_, recorder_.callback());
  // An ignored signal stays ignored in the shell's children (sleep), so nothing in the group
  // dies of SIGTERM.
  ASSERT_TRUE(
      supervisor
          .launch(shell_job("job-stubborn", "trap '' TERM; echo ready; while true; do sleep 0.05; done"))
          .ok());
  ASSERT_TRUE(wait_until([&] { return log_text(supervisor, "job-stubborn", 0) == "ready\n"; }));
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(supervisor.stop("job-stubborn").ok());
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, kGrace);
  std::vector<TaskExit> exits = recorder_.exits();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].status.signal, SIGKILL);
  EXPECT_TRUE(exits[0].stopped);
}

// A rank that created its communicator's segment and died before its peers mapped it leaves the
// name in /dev/shm; the agent removes it when it reaps the rank, and nothing else.
TEST_F(TaskSupervisorTest, AReapedRanksOrphanedSegmentNameIsRemoved) {
  const std::string shm = dir_.path() + "/shm";
  ASSERT_EQ(::mkdir(shm.c_str(), 0700), 0);
  TaskSupervisorOptions opts = options();
  opts.shared_memory_dir = shm;
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  // The rank prints its pid, then waits for the test to create the names.
  const std::string go = dir_.path() + "/go";
  ASSERT_TRUE(supervisor
                  .launch(shell_job("job-shm", "echo $$; while [ ! -e " + go + " ]; do sleep 0.02; done"))
                  .ok());
  std::string pid;
  ASSERT_TRUE(wait_until([&] {
    pid = log_text(supervisor, "job-shm", 0);
    return !pid.empty() && pid.back() == '\n';
  }));
  pid.pop_back();
  const std::string orphan = shm + "/cohort-" + pid + "-0123456789abcdef";
  // Kept: another pid's, a longer pid with this one as its prefix, a name of another shape.
  const std::vector<std::string> kept = {shm + "/cohort-1-0123456789abcdef", shm + "/cohort-" + pid + "1-0123456789abcdef",
                                         shm + "/cohort-" + pid + "-notahexname00000", shm + "/cohort-" + pid + "-0123"};
  auto create = [](const std::string& path) { ASSERT_TRUE(std::ofstream(path) << "x") << path; };
  for (const std::string& path : kept) create(path);
  // Kept too: a name of the right shape that another user owns (the rank runs as the agent's
  // user here). Only root can give a file away.
  const std::string foreign = shm + "/cohort-" + pid + "-fedcba9876543210";
  if (::geteuid() == 0) {
    create(foreign);
    ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0) << foreign;
  }
  create(orphan);
  create(go);
  ASSERT_TRUE(recorder_.wait_for(1));
  EXPECT_FALSE(std::filesystem::exists(orphan));
  for (const std::string& path : kept) EXPECT_TRUE(std::filesystem::exists(path)) << path;
  if (::geteuid() == 0) {
    EXPECT_TRUE(std::filesystem::exists(foreign)) << "another user's segment name was removed";
  } else {
    GTEST_LOG_(INFO) << "not root: the other user's name was not tried (only root can chown a file away)";
  }
}

// At shutdown every job's ranks share one grace period: three jobs whose ranks ignore SIGTERM
// take one grace period to stop, not three.
TEST_F(TaskSupervisorTest, ShutdownStopsEveryJobWithinOneGracePeriod) {
  constexpr Duration kGrace = 1500ms;
  constexpr int kJobs = 3;
  std::optional<TaskSupervisor> supervisor;
  supervisor.emplace(options(kGrace), &launcher_, recorder_.callback());
  for (int j = 0; j < kJobs; ++j) {
    const std::string id = fmt::format("job-stubborn-{}", j);
    ASSERT_TRUE(
        supervisor->launch(shell_job(id, "trap '' TERM; echo ready; while true; do sleep 0.05; done")).ok());
    ASSERT_TRUE(wait_until([&] { return log_text(*supervisor, id, 0) == "ready\n"; }));
  }
  auto start = std::chrono::steady_clock::now();
  supervisor.reset();  // ~TaskSupervisor stops them
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, kGrace);
  EXPECT_LT(elapsed, 2 * kGrace) << "the jobs' grace periods ran one after another";
  std::vector<TaskExit> exits = recorder_.exits();
  ASSERT_EQ(exits.size(), static_cast<size_t>(kJobs));
  for (const TaskExit& exit : exits) {
    EXPECT_EQ(exit.status.signal, SIGKILL);
    EXPECT_TRUE(exit.stopped);
  }
}

TEST_F(TaskSupervisorTest, StopKillsTheWholeGroupIncludingGrandchildren) {
  TaskSupervisor supervisor(options(), &launcher_, recorder_.callback());
  ASSERT_TRUE(supervisor.launch(shell_job("job-tree", "sleep 100 & wait")).ok());
  auto tasks = supervisor.tasks("job-tree");
  ASSERT_TRUE(tasks.ok());
  pid_t pgid = (*tasks)[0].pid;
  ASSERT_TRUE(wait_until([&] { return testing::live_processes_in_group(pgid).size() >= 2; }));
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(supervisor.stop("job-tree").ok());
  // SIGTERM was enough: no waiting out the 5 s grace period.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  // The group got SIGKILL when its leader was reaped; the kernel finishes that kill
  // asynchronously, so a grandchild may still show as running for a moment.
  EXPECT_TRUE(wait_until([&] { return testing::live_processes_in_group(pgid).empty(); }));
  std::vector<TaskExit> exits = recorder_.exits();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].status.signal, SIGTERM);
  EXPECT_TRUE(exits[0].stopped);
}

TEST_F(TaskSupervisorTest, OneFailingRankIsReportedWhileTheOthersRun) {
  TaskSupervisor supervisor(options(), &launcher_, recorder_.callback());
  ASSERT_TRUE(
      supervisor.launch(shell_job("job-3", "if [ \"$RANK\" = 1 ]; then exit 7; fi; sleep 100", 3)).ok());
  ASSERT_TRUE(recorder_.wait_for(1));
  std::vector<TaskExit> exits = recorder_.exits();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].rank, 1);
  EXPECT_EQ(exits[0].status, (ExitStatus{7, 0}));
  EXPECT_FALSE(exits[0].stopped);
  EXPECT_EQ(supervisor.running_tasks(), 2);

  // What the coordinator then does: stop the rest.
  ASSERT_TRUE(supervisor.stop("job-3").ok());
  exits = recorder_.exits();
  ASSERT_EQ(exits.size(), 3u);
  for (size_t i = 1; i < exits.size(); ++i) {
    EXPECT_NE(exits[i].rank, 1);
    EXPECT_TRUE(exits[i].stopped);
  }
  EXPECT_EQ(supervisor.running_tasks(), 0);
}

// ---- the grace period driven by a FakeClock over a fake launcher: no real processes ----

class FakeProcess final : public ProcessHandle {
 public:
  explicit FakeProcess(pid_t pid) : pid_(pid) {}
  pid_t pid() const override { return pid_; }
  pid_t pgid() const override { return pid_; }
  Status signal_group(int sig) override {
    std::lock_guard<std::mutex> lock(mu_);
    signals_.push_back(sig);
    if (sig == SIGKILL && !exit_.has_value()) exit_ = ExitStatus{0, SIGKILL};  // TERM is ignored
    return ok_status();
  }
  std::optional<ExitStatus> poll_exit() override {
    std::lock_guard<std::mutex> lock(mu_);
    return exit_;
  }
  bool wait_output_closed(std::chrono::milliseconds) override { return true; }
  // A cgroup whose strays hang in the kernel, when `cgroup_stuck_for` is positive: the removal
  // waits until the deadline, or that long (a real cgroup's empty timeout), and fails.
  Status remove_cgroup(std::chrono::steady_clock::time_point deadline) override {
    if (cgroup_stuck_for.count() <= 0) return ok_status();
    std::this_thread::sleep_until(std::min(deadline, std::chrono::steady_clock::now() + cgroup_stuck_for));
    return deadline_exceeded_error("fake cgroup of pid {} still holds pids", pid_);
  }
  std::chrono::milliseconds cgroup_stuck_for{0};
  std::vector<int> signals() const {
    std::lock_guard<std::mutex> lock(mu_);
    return signals_;
  }

 private:
  const pid_t pid_;
  mutable std::mutex mu_;
  std::vector<int> signals_;
  std::optional<ExitStatus> exit_;
};

class FakeLauncher final : public ProcessLauncher {
 public:
  StatusOr<std::unique_ptr<ProcessHandle>> launch(const LaunchOptions& options) override {
    auto process = std::make_unique<FakeProcess>(next_pid_++);
    process->cgroup_stuck_for = cgroup_stuck_for_;
    processes_.push_back(process.get());
    return std::unique_ptr<ProcessHandle>(std::move(process));
  }
  std::vector<FakeProcess*> processes_;  // owned by the supervisor's tasks
  pid_t next_pid_ = 1000;
  std::chrono::milliseconds cgroup_stuck_for_{0};  // FakeProcess::cgroup_stuck_for of later launches
};

TEST_F(TaskSupervisorTest, KillFollowsTermOnlyWhenTheFakeClockPassesTheGracePeriod) {
  coordinator::FakeClock clock;
  FakeLauncher launcher;
  TaskSupervisorOptions opts = options(30s);
  opts.clock = &clock;
  TaskSupervisor supervisor(opts, &launcher, recorder_.callback());
  ASSERT_TRUE(supervisor.launch(shell_job("job-fake", "unused", 2)).ok());
  ASSERT_EQ(launcher.processes_.size(), 2u);

  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    EXPECT_TRUE(supervisor.stop("job-fake").ok());
    stopped = true;
  });
  ASSERT_TRUE(wait_until([&] {
    return launcher.processes_[0]->signals().size() == 1 && launcher.processes_[1]->signals().size() == 1;
  }));
  clock.advance(29s);
  std::this_thread::sleep_for(50ms);  // several poll intervals: still only SIGTERM
  EXPECT_FALSE(stopped);
  EXPECT_EQ(launcher.processes_[0]->signals(), std::vector<int>{SIGTERM});
  clock.advance(1s);
  stopper.join();
  EXPECT_TRUE(stopped);
  for (FakeProcess* process : launcher.processes_) {
    EXPECT_EQ(process->signals().front(), SIGTERM);
    EXPECT_EQ(process->signals()[1], SIGKILL);
  }
  std::vector<TaskExit> exits = recorder_.exits();
  ASSERT_EQ(exits.size(), 2u);
  EXPECT_EQ(exits[0].status.signal, SIGKILL);
  EXPECT_TRUE(exits[0].stopped);
}


// The ranks of one stop whose cgroups will not empty (strays stuck in the kernel) cost one removal
// wait together, not one each: before, each rank's reap waited its cgroup's whole empty timeout,
// one after another (8 ranks x 1 s here; 5 s each with the real default).
TEST_F(TaskSupervisorTest, StuckCgroupsOfOneStopShareOneRemovalWait) {
  FakeLauncher launcher;
  launcher.cgroup_stuck_for_ = 1s;
  TaskSupervisorOptions opts = options(0s);
  opts.cgroup_removal_wait = 300ms;
  TaskSupervisor supervisor(opts, &launcher, recorder_.callback());
  ASSERT_TRUE(supervisor.launch(shell_job("job-stuck", "unused", 8)).ok());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(supervisor.stop("job-stuck").ok());
  const auto took = std::chrono::steady_clock::now() - start;
  // 300 ms shared, then at least kMinimumCgroupRemovalWait (100 ms) for each of the others (the
  // monitor thread reaps some with a wait of its own): about 1 s at most; eight full waits would be
  // 8 s (4 s with the monitor reaping half).
  EXPECT_LT(took, 2500ms) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_GE(took, 300ms) << "the removals did not wait at all";
  EXPECT_EQ(recorder_.exits().size(), 8u) << "every rank's exit is reported, its cgroup left or not";
}

// ---- hang detection (issue 16): real processes, short limits ----

pid_t pid_of(TaskSupervisor& supervisor, const std::string& job_id, int rank) {
  auto tasks = supervisor.tasks(job_id);
  if (!tasks.ok()) return 0;
  for (const TaskInfo& task : *tasks) {
    if (task.rank == rank) return task.pid;
  }
  return 0;
}

TEST_F(TaskSupervisorTest, AStoppedRankIsKilledAfterTheLimitAndTheExitSaysWhy) {
  TaskSupervisorOptions opts = options();
  opts.stopped_task_limit = 300ms;
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  ASSERT_TRUE(supervisor.launch(shell_job("job-stop", "sleep 100", 2)).ok());
  const pid_t pid = pid_of(supervisor, "job-stop", 1);
  ASSERT_GT(pid, 0);
  const auto stopped_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  ASSERT_TRUE(recorder_.wait_for(1));
  const auto seen_after = std::chrono::steady_clock::now() - stopped_at;
  std::vector<TaskExit> exits = recorder_.exits();
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].rank, 1);
  EXPECT_EQ(exits[0].status.signal, SIGKILL);
  EXPECT_FALSE(exits[0].stopped) << "a hang is a failure, not a cancel";
  EXPECT_NE(exits[0].detail.find(fmt::format("pid {} stopped (SIGSTOP", pid)), std::string::npos)
      << exits[0].detail;
  EXPECT_NE(exits[0].detail.find("stopped_task_limit 300 ms"), std::string::npos) << exits[0].detail;
  EXPECT_GE(seen_after, 300ms);
  EXPECT_EQ(supervisor.running_tasks(), 1) << "the healthy rank is left to the coordinator's stop";
  ASSERT_TRUE(supervisor.stop("job-stop").ok());
}

TEST_F(TaskSupervisorTest, ABriefStopIsForgiven) {
  TaskSupervisorOptions opts = options();
  opts.stopped_task_limit = 3s;
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  ASSERT_TRUE(supervisor.launch(shell_job("job-brief", "sleep 1; exit 0")).ok());
  const pid_t pid = pid_of(supervisor, "job-brief", 0);
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  // Seen stopped by the monitor (50 ms polls), then continued well before the limit.
  std::this_thread::sleep_for(300ms);
  ASSERT_EQ(::kill(pid, SIGCONT), 0);
  ASSERT_TRUE(recorder_.wait_for(1));
  std::vector<TaskExit> exits = recorder_.exits();
  EXPECT_EQ(exits[0].status, (ExitStatus{0, 0}));
  EXPECT_EQ(exits[0].detail, "");
}

TEST_F(TaskSupervisorTest, ARankThatStopsBeatingIsKilledAndTheExitSaysWhy) {
  TaskSupervisorOptions opts = options();
  opts.heartbeat_timeout = 300ms;
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  JobTasks job = shell_job("job-silent", "touch \"$COHORT_HEARTBEAT_FILE\"; sleep 100");
  job.heartbeat_dir = dir_.path();
  ASSERT_TRUE(supervisor.launch(job).ok());
  ASSERT_TRUE(recorder_.wait_for(1));
  std::vector<TaskExit> exits = recorder_.exits();
  EXPECT_EQ(exits[0].status.signal, SIGKILL);
  EXPECT_NE(exits[0].detail.find("sent no heartbeat for"), std::string::npos) << exits[0].detail;
  EXPECT_NE(exits[0].detail.find(dir_.path() + "/heartbeat-rank-0"), std::string::npos) << exits[0].detail;
}

// A rank in a long computation keeps beating from its own thread (here: a loop that touches the file
// while the "computation" takes three times the timeout), and is not killed; a program that never
// beats is not held to the heartbeat at all.
TEST_F(TaskSupervisorTest, ABusyRankThatBeatsAndARankThatNeverBeatsAreNotKilled) {
  TaskSupervisorOptions opts = options();
  opts.heartbeat_timeout = 300ms;
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  JobTasks job = shell_job("job-busy",
                           "if [ \"$RANK\" = 1 ]; then sleep 1; exit 0; fi; "
                           "i=0; while [ $i -lt 20 ]; do touch \"$COHORT_HEARTBEAT_FILE\"; sleep 0.05; "
                           "i=$((i+1)); done; exit 0",
                           2);
  job.heartbeat_dir = dir_.path();
  ASSERT_TRUE(supervisor.launch(job).ok());
  ASSERT_TRUE(recorder_.wait_for(2));
  for (const TaskExit& exit : recorder_.exits()) {
    EXPECT_EQ(exit.status, (ExitStatus{0, 0})) << "rank " << exit.rank << ": " << exit.detail;
    EXPECT_EQ(exit.detail, "");
  }
}

}  // namespace
}  // namespace cohort::agent

namespace cohort::agent {
namespace {

// job_retention on the agent, driven by a FakeClock whose wall time starts at the real one (the
// log files' modification times are real): an ended job's log directory is deleted, and the job
// forgotten, once the clock passes its last write by the retention period; a running job's stays.
// Bytes of a job's rank log files on disk (every attempt; not the .times indexes or job files).
uint64_t rank_log_bytes_on_disk(const std::string& job_dir) {
  uint64_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(job_dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.rfind("rank-", 0) == 0 && name.find(".times") == std::string::npos)
      total += entry.file_size();
  }
  return total;
}

TEST_F(TaskSupervisorTest, AJobsLogsStayWithinTheCapOverAllItsAttemptsKeepingTheNewest) {
  TaskSupervisorOptions opts = options();
  constexpr uint64_t kCap = 8000;
  opts.max_log_bytes_per_job = kCap;
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  const std::string job_dir = dir_.path() + "/logs/chatty-1";
  // Each attempt writes 6000 bytes on each of its 2 ranks: 12000, more than the whole cap, and
  // five attempts write 60000. Capped per attempt only, the job would keep 5 x 8000 here.
  constexpr int kAttempts = 5;
  for (int attempt = 1; attempt <= kAttempts; ++attempt) {
    JobTasks job = shell_job("chatty-1", fmt::format("yes attempt-{}-rank-$RANK | head -c 6000", attempt), 2);
    job.attempt = attempt;
    ASSERT_TRUE(supervisor.launch(job).ok()) << attempt;
    ASSERT_TRUE(recorder_.wait_for(static_cast<size_t>(2 * attempt))) << attempt;
    EXPECT_LE(rank_log_bytes_on_disk(job_dir), kCap) << "after attempt " << attempt;
  }
  // The newest attempt kept the newest output of each rank.
  for (int rank = 0; rank < 2; ++rank) {
    std::string newest;
    ASSERT_TRUE(supervisor
                    .read_log_files("chatty-1", kAttempts, rank, {},
                                    [&](std::string_view bytes) {
                                      newest.append(bytes);
                                      return true;
                                    })
                    .ok());
    ASSERT_GT(newest.size(), 0u);
    EXPECT_NE(newest.find(fmt::format("attempt-{}-rank-{}", kAttempts, rank)), std::string::npos);
    EXPECT_EQ(newest.find("attempt-1-"), std::string::npos);
  }
  // The previous attempt is still readable; the first one's files were removed by the cap, which
  // the error says.
  std::string previous;
  EXPECT_TRUE(supervisor
                  .read_log_files("chatty-1", kAttempts - 1, 0, {},
                                  [&](std::string_view bytes) {
                                    previous.append(bytes);
                                    return true;
                                  })
                  .ok());
  EXPECT_NE(previous.find(fmt::format("attempt-{}-rank-0", kAttempts - 1)), std::string::npos);
  Status removed = supervisor.read_log_files("chatty-1", 1, 0, {}, [](std::string_view) { return true; });
  EXPECT_EQ(removed.code(), StatusCode::kNotFound);
  EXPECT_NE(removed.message().find("removed to keep the job's rank logs on this node within max_log_bytes_per_job "
                                   "(8000 bytes)"),
            std::string::npos)
      << removed.to_string();
  EXPECT_TRUE(std::filesystem::exists(job_dir + "/attempt-1/" + kLogsRemovedMarker));
  // A job that never ran here is still plain NOT_FOUND, without the cap's explanation.
  Status never = supervisor.read_log_files("other-2", 1, 0, {}, [](std::string_view) { return true; });
  EXPECT_EQ(never.code(), StatusCode::kNotFound);
  EXPECT_EQ(never.message().find("max_log_bytes_per_job"), std::string::npos);
}

TEST_F(TaskSupervisorTest, EndedJobsLogsAreDeletedAfterTheRetentionPeriod) {
  const int64_t real_now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count();
  coordinator::FakeClock clock(real_now_ms);
  TaskSupervisorOptions opts = options();
  opts.clock = &clock;
  opts.log_retention = std::chrono::hours(1);
  // The jobs' own directories (checkpoints, scratch) go by the same rule.
  const std::string jobs = dir_.path() + "/jobs";
  opts.job_dir_root = jobs;
  for (const char* job : {"ended-1", "running-2"}) {
    std::filesystem::create_directories(jobs + "/" + job + "/checkpoint");
    std::ofstream(jobs + "/" + job + "/checkpoint/iter-1.pt") << "weights";
  }
  TaskSupervisor supervisor(opts, &launcher_, recorder_.callback());
  ASSERT_TRUE(supervisor.launch(shell_job("ended-1", "echo done")).ok());
  ASSERT_TRUE(recorder_.wait_for(1));
  ASSERT_TRUE(supervisor.launch(shell_job("running-2", "sleep 100")).ok());
  const std::string logs = dir_.path() + "/logs";
  ASSERT_TRUE(std::filesystem::exists(logs + "/ended-1/rank-0.log"));

  // Not yet: a minute short of the period (and past a sweep interval, so a sweep runs).
  clock.advance(std::chrono::minutes(59));
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(std::filesystem::exists(logs + "/ended-1/rank-0.log"));
  EXPECT_TRUE(std::filesystem::exists(jobs + "/ended-1/checkpoint/iter-1.pt"));

  clock.advance(std::chrono::minutes(2));
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::filesystem::exists(logs + "/ended-1") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(std::filesystem::exists(logs + "/ended-1")) << "not deleted after the retention period";
  EXPECT_EQ(supervisor.tasks("ended-1").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(std::filesystem::exists(logs + "/running-2/rank-0.log")) << "a running job's logs were deleted";
  EXPECT_TRUE(supervisor.tasks("running-2").ok());
  EXPECT_TRUE(wait_until([&] { return !std::filesystem::exists(jobs + "/ended-1"); }))
      << "the job directory was not deleted after the retention period";
  EXPECT_TRUE(std::filesystem::exists(jobs + "/running-2/checkpoint/iter-1.pt")) << "a running job's directory went";
  ASSERT_TRUE(supervisor.stop("running-2").ok());
}

// Containment (task_cgroups.h): a rank's process that left its process group (setsid) ends with
// the rank, whether the rank exits or is stopped, and the rank's cgroup is removed by the time its
// exit is reported. Real cgroups; skipped where the test's user has no writable cgroup v2.
class TaskSupervisorCgroupTest : public TaskSupervisorTest {
 protected:
  // The stray's pid, which it printed into the rank's log; 0 if it never did.
  pid_t stray_pid(TaskSupervisor& supervisor, const std::string& job_id) {
    pid_t pid = 0;
    wait_until([&] {
      const std::string text = log_text(supervisor, job_id, 0);
      if (text.find('\n') == std::string::npos) return false;
      pid = static_cast<pid_t>(std::stol(text));
      return true;
    });
    return pid;
  }
  void end(pid_t pid) {
    if (pid > 0 && testing::process_alive(pid)) ::kill(pid, SIGKILL);
  }

  static constexpr const char* kStray = "setsid sh -c 'echo $$; exec sleep 1000' </dev/null & ";
};

TEST_F(TaskSupervisorCgroupTest, ARanksStrayThatLeftItsGroupEndsWithTheRank) {
  testing::TestCgroups cgroups;
  COHORT_SKIP_WITHOUT_CGROUPS(cgroups);
  launcher_.set_task_cgroups(cgroups.get());
  TaskSupervisor supervisor(options(), &launcher_, recorder_.callback());
  // The rank waits until the stray has printed its pid (into a file the rank then prints): the
  // monitor kills the rank's cgroup as soon as it reaps the rank, which could otherwise come before
  // the stray printed anything.
  const std::string pid_file = dir_.path() + "/stray.pid";
  JobTasks job = shell_job("job-cg", "setsid sh -c 'echo $$ > " + pid_file +
                                         "; exec sleep 1000' </dev/null & while [ ! -s " + pid_file +
                                         " ]; do sleep 0.01; done; cat " + pid_file + "; exit 0");
  job.attempt = 2;
  ASSERT_TRUE(supervisor.launch(job).ok());
  const pid_t stray = stray_pid(supervisor, "job-cg");
  ASSERT_GT(stray, 0) << log_text(supervisor, "job-cg", 0);
  ASSERT_TRUE(recorder_.wait_for(1));
  EXPECT_TRUE(recorder_.exits()[0].status.success());
  // By the time the exit is reported the stray is gone and so is the cgroup.
  EXPECT_FALSE(testing::process_alive(stray)) << "pid " << stray << " outlived its rank";
  auto tasks = supervisor.tasks("job-cg");
  ASSERT_TRUE(tasks.ok());
  const std::string cgroup = (*tasks)[0].cgroup;
  EXPECT_EQ(cgroup, cgroups.get()->path() + "/job-cg.attempt-2.rank-0");
  EXPECT_FALSE(std::filesystem::exists(cgroup)) << cgroup << " was not removed";
  end(stray);
}

// A job id given again at the same attempt (a coordinator restored from its store, or a fresh one,
// numbers jobs <name>-<seq> again) gets the same cgroup names. The ended job the supervisor kept
// for its logs is replaced then, and its handles go: before, their destructors killed the new
// ranks' cgroups by path (and did so while holding the supervisor's lock).
TEST_F(TaskSupervisorCgroupTest, AJobIdGivenAgainKeepsItsNewRanksRunning) {
  testing::TestCgroups cgroups;
  COHORT_SKIP_WITHOUT_CGROUPS(cgroups);
  launcher_.set_task_cgroups(cgroups.get());
  TaskSupervisor supervisor(options(2s), &launcher_, recorder_.callback());
  JobTasks job = shell_job("train-1", "exit 0");
  job.attempt = 1;
  ASSERT_TRUE(supervisor.launch(job).ok());
  ASSERT_TRUE(recorder_.wait_for(1));
  const std::string cgroup = cgroups.get()->path() + "/train-1.attempt-1.rank-0";
  EXPECT_FALSE(std::filesystem::exists(cgroup));

  job.argv = {"/bin/sh", "-c", "exec sleep 1000"};
  ASSERT_TRUE(supervisor.launch(job).ok());
  auto tasks = supervisor.tasks("train-1");
  ASSERT_TRUE(tasks.ok());
  const pid_t pid = (*tasks)[0].pid;
  EXPECT_EQ((*tasks)[0].cgroup, cgroup);
  EXPECT_TRUE(testing::process_alive(pid)) << "the new rank " << pid << " was killed at its launch";
  EXPECT_TRUE(std::filesystem::exists(cgroup)) << "the new rank's cgroup was removed at its launch";
  std::this_thread::sleep_for(100ms);  // several monitor passes
  EXPECT_EQ(supervisor.running_tasks(), 1);
  EXPECT_EQ(recorder_.exits().size(), 1u);
  ASSERT_TRUE(supervisor.stop("train-1").ok());
  EXPECT_FALSE(std::filesystem::exists(cgroup));
}

TEST_F(TaskSupervisorCgroupTest, StoppingAJobKillsWhatLeftTheRanksGroups) {
  testing::TestCgroups cgroups;
  COHORT_SKIP_WITHOUT_CGROUPS(cgroups);
  launcher_.set_task_cgroups(cgroups.get());
  TaskSupervisor supervisor(options(2s), &launcher_, recorder_.callback());
  ASSERT_TRUE(supervisor.launch(shell_job("job-stop-cg", std::string(kStray) + "exec sleep 1000")).ok());
  const pid_t stray = stray_pid(supervisor, "job-stop-cg");
  ASSERT_GT(stray, 0) << log_text(supervisor, "job-stop-cg", 0);
  const std::string cgroup = (*supervisor.tasks("job-stop-cg"))[0].cgroup;
  EXPECT_TRUE(std::filesystem::exists(cgroup));
  ASSERT_TRUE(supervisor.stop("job-stop-cg").ok());
  ASSERT_TRUE(recorder_.wait_for(1));
  EXPECT_TRUE(recorder_.exits()[0].stopped);
  EXPECT_EQ(recorder_.exits()[0].status.signal, SIGTERM) << "the rank itself was stopped gracefully";
  EXPECT_FALSE(testing::process_alive(stray)) << "pid " << stray << " outlived the stopped job";
  EXPECT_FALSE(std::filesystem::exists(cgroup)) << cgroup << " was not removed";
  end(stray);
}

}  // namespace
}  // namespace cohort::agent
