// Task containment in cgroup v2: a process that leaves its task's process group (setsid, a double
// fork) is still killed when the task ends or is stopped, the cgroup is removed, a restarted agent
// kills what an earlier run left, and the job's user cannot move itself out. The cgroups are real
// (the machine's cgroup2 mount); where the test's user has none it may write, those tests skip.

#include "daemon/agent/task_cgroups.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/agent/process_launcher.h"
#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

using testing::Collected;
using testing::kTestWaitTimeout;
using testing::process_alive;
using testing::read_file;
using testing::TempDir;
using testing::TestCgroups;
using testing::wait_until;

#define SKIP_WITHOUT_CGROUPS(cgroups) COHORT_SKIP_WITHOUT_CGROUPS(cgroups)

// A shell line that starts `sleep 1000` in a session of its own (so outside the task's process
// group, which the task's end and stop signal) and prints its pid first.
constexpr const char* kSetsidSleeper = "setsid sh -c 'echo $$; exec sleep 1000' </dev/null";

// The first number the task printed (the stray's pid), once it did; 0 if it never did.
pid_t printed_pid(Collected& out) {
  pid_t pid = 0;
  wait_until([&] {
    const std::string text = out.get();
    if (text.find('\n') == std::string::npos) return false;
    pid = static_cast<pid_t>(std::stol(text));
    return true;
  });
  return pid;
}

std::optional<ExitStatus> wait_exit(ProcessHandle& process) {
  std::optional<ExitStatus> exit;
  wait_until([&] { return (exit = process.poll_exit()).has_value(); });
  return exit;
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

// Ends a stray that a failed expectation left running.
void end(pid_t pid) {
  if (pid > 0 && process_alive(pid)) ::kill(pid, SIGKILL);
}

// The launch of `sh -c <script>` with containment, stdout collected.
StatusOr<std::unique_ptr<ProcessHandle>> launch_shell(PosixProcessLauncher& launcher,
                                                      const std::string& script, Collected& out) {
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", script};
  options.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  options.on_stdout = out.callback();
  return launcher.launch(options);
}

// A task cgroup as a killed agent leaves it: its rank died (PR_SET_PDEATHSIG), its setsid child
// runs on. Made by hand, as no handle may clean it up. The stray's pid; 0 when it could not start.
pid_t leave_stray(const std::string& cgroup) {
  if (::mkdir(cgroup.c_str(), 0755) != 0) return 0;
  int fds[2];
  if (::pipe(fds) != 0) return 0;
  const pid_t child = ::fork();
  if (child == 0) {
    const int procs = ::open((cgroup + "/cgroup.procs").c_str(), O_WRONLY);
    if (procs < 0 || ::write(procs, "0", 1) != 1) ::_exit(1);
    ::dup2(fds[1], STDOUT_FILENO);
    ::execl("/bin/sh", "sh", "-c", "setsid sh -c 'echo $$; exec sleep 1000' </dev/null 2>/dev/null &",
            nullptr);
    ::_exit(1);
  }
  ::close(fds[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  char buffer[32] = {};
  const ssize_t n = ::read(fds[0], buffer, sizeof(buffer) - 1);
  ::close(fds[0]);
  return n > 0 ? static_cast<pid_t>(std::atol(buffer)) : 0;
}

// The task's end: what it left outside its group dies with it and the cgroup goes. Run with each
// kill method (cgroup.kill, and the freezer fallback older kernels get).
void expect_stray_dies_with_its_task(bool use_cgroup_kill) {
  TaskCgroupsOptions options;
  options.use_cgroup_kill = use_cgroup_kill;
  TestCgroups cgroups(options);
  SKIP_WITHOUT_CGROUPS(cgroups);
  if (!use_cgroup_kill) {
    EXPECT_FALSE(cgroups.get()->uses_cgroup_kill());
  }
  PosixProcessLauncher launcher;
  launcher.set_task_cgroups(cgroups.get());
  Collected out;
  auto process = launch_shell(launcher, std::string(kSetsidSleeper) + " & exit 0", out);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  const std::string cgroup = (*process)->cgroup_path();
  EXPECT_EQ(cgroup.rfind(cgroups.get()->path() + "/task-", 0), 0u) << cgroup;
  const pid_t stray = printed_pid(out);
  ASSERT_GT(stray, 0) << "the task printed no pid: " << out.get();
  // The stray is in the task's cgroup, though not in its process group.
  EXPECT_NE(read_file(cgroup + "/cgroup.procs").find(std::to_string(stray)), std::string::npos);

  std::optional<ExitStatus> exit = wait_exit(**process);
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->success()) << exit->to_string();
  Status removed = (*process)->remove_cgroup();
  EXPECT_TRUE(removed.ok()) << removed.to_string();
  EXPECT_TRUE(wait_until([&] { return !process_alive(stray); })) << "pid " << stray << " outlived its task";
  EXPECT_FALSE(exists(cgroup)) << cgroup << " was not removed";
  // Nothing holds the pipes any more.
  EXPECT_TRUE((*process)->wait_output_closed(kTestWaitTimeout));
  end(stray);
}

TEST(TaskCgroupsTest, AProcessThatLeftItsGroupDiesWhenItsTaskEnds) { expect_stray_dies_with_its_task(true); }

TEST(TaskCgroupsTest, TheFreezerFallbackKillsItToo) { expect_stray_dies_with_its_task(false); }

TEST(TaskCgroupsTest, StoppingATaskKillsADoubleForkedDaemon) {
  TestCgroups cgroups;
  SKIP_WITHOUT_CGROUPS(cgroups);
  PosixProcessLauncher launcher;
  launcher.set_task_cgroups(cgroups.get());
  Collected out;
  // The subshell forks the daemon and exits, so the daemon's parent is gone (a double fork); the
  // task itself keeps running until it is stopped.
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", std::string("( ") + kSetsidSleeper + " & ) ; exec sleep 1000"};
  options.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  options.on_stdout = out.callback();
  options.cgroup_name = "job-a.attempt-1.rank-0";
  auto process = launcher.launch(options);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  const std::string cgroup = (*process)->cgroup_path();
  EXPECT_EQ(cgroup, cgroups.get()->path() + "/job-a.attempt-1.rank-0");
  const pid_t daemon = printed_pid(out);
  ASSERT_GT(daemon, 0) << out.get();
  EXPECT_TRUE(process_alive(daemon));

  // A name still in use is refused, and the running task is not touched.
  options.argv = {"/bin/true"};
  auto twice = launcher.launch(options);
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), StatusCode::kAlreadyExists) << twice.status().to_string();
  EXPECT_NE(twice.status().message().find(cgroup), std::string::npos) << twice.status().message();
  EXPECT_TRUE(process_alive(daemon));

  // The supervisor's stop: SIGTERM to the group (the daemon is not in it), then kill_all.
  ASSERT_TRUE((*process)->signal_group(SIGTERM).ok());
  std::optional<ExitStatus> exit = wait_exit(**process);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGTERM);
  EXPECT_TRUE((*process)->kill_all().ok());
  EXPECT_TRUE((*process)->remove_cgroup().ok());
  EXPECT_TRUE(wait_until([&] { return !process_alive(daemon); })) << "pid " << daemon << " outlived its task";
  EXPECT_FALSE(exists(cgroup));
  end(daemon);
}

TEST(TaskCgroupsTest, KillAllEndsARunningTaskAndEverythingItStarted) {
  TestCgroups cgroups;
  SKIP_WITHOUT_CGROUPS(cgroups);
  PosixProcessLauncher launcher;
  launcher.set_task_cgroups(cgroups.get());
  Collected out;
  auto process = launch_shell(launcher, std::string(kSetsidSleeper) + " & exec sleep 1000", out);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  const pid_t stray = printed_pid(out);
  ASSERT_GT(stray, 0) << out.get();
  // While it runs its cgroup stays.
  EXPECT_EQ((*process)->remove_cgroup().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*process)->kill_all().ok());
  std::optional<ExitStatus> exit = wait_exit(**process);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_TRUE((*process)->remove_cgroup().ok());
  EXPECT_TRUE(wait_until([&] { return !process_alive(stray); }));
  end(stray);
}

// A handle kept after its task ended (the supervisor keeps ended jobs for their logs) must never
// act on a later task's cgroup of the same name: a job id given again at the same attempt (after a
// coordinator's restore, ids are <name>-<seq> again) makes the same name. Before, the old handle's
// cgroup still counted as its own after its removal, and its destructor (or a late kill_all) wrote
// cgroup.kill into the new task's cgroup by path and removed it: the new rank died at launch.
void expect_relaunched_name_survives_the_earlier_handle(bool use_cgroup_kill) {
  TaskCgroupsOptions cgroup_options;
  cgroup_options.use_cgroup_kill = use_cgroup_kill;
  TestCgroups cgroups(cgroup_options);
  SKIP_WITHOUT_CGROUPS(cgroups);
  PosixProcessLauncher launcher;
  launcher.set_task_cgroups(cgroups.get());
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", "exit 0"};
  options.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  options.cgroup_name = "train-1.attempt-1.rank-0";
  const std::string cgroup = cgroups.get()->path() + "/" + options.cgroup_name;
  auto first = launcher.launch(options);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_TRUE(wait_exit(**first).has_value());
  Status removed = (*first)->remove_cgroup();
  ASSERT_TRUE(removed.ok()) << removed.to_string();
  ASSERT_FALSE(exists(cgroup));

  options.argv = {"/bin/sleep", "1000"};
  auto second = launcher.launch(options);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  ASSERT_EQ((*second)->cgroup_path(), cgroup);
  const pid_t pid = (*second)->pid();
  // The earlier handle, used and then dropped while the new task runs.
  EXPECT_TRUE((*first)->kill_all().ok());
  EXPECT_TRUE((*first)->remove_cgroup().ok());
  first->reset();
  EXPECT_FALSE((*second)->poll_exit().has_value()) << "the earlier handle killed the new task";
  EXPECT_TRUE(process_alive(pid)) << "pid " << pid << " of the new task died";
  EXPECT_TRUE(exists(cgroup)) << "the earlier handle removed the new task's cgroup";
  EXPECT_NE(read_file(cgroup + "/cgroup.procs").find(std::to_string(pid)), std::string::npos);

  ASSERT_TRUE((*second)->kill_all().ok());
  ASSERT_TRUE(wait_exit(**second).has_value());
  EXPECT_TRUE((*second)->remove_cgroup().ok());
  EXPECT_FALSE(exists(cgroup));
}

TEST(TaskCgroupsTest, AnEndedTasksHandleLeavesALaterTaskOfTheSameNameAlone) {
  expect_relaunched_name_survives_the_earlier_handle(true);
}

TEST(TaskCgroupsTest, AnEndedTasksHandleLeavesALaterTaskOfTheSameNameAloneWithTheFreezerFallback) {
  expect_relaunched_name_survives_the_earlier_handle(false);
}

// A test process killed mid-test (a timeout, SIGKILL) leaves its agent directory and the strays in
// it; the next test's TestCgroups removes them, and leaves the directories of live tests alone.
TEST(TaskCgroupsTest, WhatAKilledTestProcessLeftIsRemovedByTheNextTest) {
  TestCgroups cgroups;
  SKIP_WITHOUT_CGROUPS(cgroups);
  const std::string tasks_dir = cgroups.get()->path().substr(0, cgroups.get()->path().rfind('/'));
  // A pid that runs no more: a child that has exited and been reaped.
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(dead, &status, 0), dead);
  const std::string agent_dir =
      tasks_dir + "/" + cgroup_name_for(std::string(testing::kTestCgroupKeyPrefix) + std::to_string(dead) + "-0");
  ASSERT_EQ(::mkdir(agent_dir.c_str(), 0755), 0) << agent_dir << ": " << std::strerror(errno);
  const pid_t stray = leave_stray(agent_dir + "/job-a.attempt-1.rank-0");
  if (stray <= 0) {
    ::rmdir((agent_dir + "/job-a.attempt-1.rank-0").c_str());
    ::rmdir(agent_dir.c_str());
    FAIL() << "could not start a process in " << agent_dir;
  }
  const std::vector<std::string> removed = testing::remove_dead_tests_cgroups(tasks_dir);
  EXPECT_NE(std::find(removed.begin(), removed.end(), agent_dir), removed.end()) << agent_dir;
  EXPECT_FALSE(exists(agent_dir));
  EXPECT_TRUE(wait_until([&] { return !process_alive(stray); })) << "the stray pid " << stray << " survived";
  // This test's own directory (its pid runs) stays.
  EXPECT_TRUE(exists(cgroups.get()->path()));
  end(stray);
  // Should the sweep have failed: what this test made goes anyway, once the stray's exit has left
  // the cgroup (rmdir fails with EBUSY until then).
  for (const std::string& path : {agent_dir + "/job-a.attempt-1.rank-0", agent_dir}) {
    wait_until([&] { return ::rmdir(path.c_str()) == 0 || errno == ENOENT; });
  }
}

// What the containment is for: without it, the task's end kills its process group only, and a
// process that left the group runs on. (This is also the fallback where no cgroup v2 is usable:
// the group is still killed.)
TEST(TaskCgroupsTest, WithoutCgroupsOnlyTheProcessGroupDiesWithTheTask) {
  PosixProcessLauncher launcher;  // no set_task_cgroups: process groups only
  Collected out;
  auto process =
      launch_shell(launcher, std::string(kSetsidSleeper) + " & sleep 1000 & echo $! >&2; exit 0", out);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  EXPECT_EQ((*process)->cgroup_path(), "");
  const pid_t stray = printed_pid(out);
  ASSERT_GT(stray, 0) << out.get();
  const pid_t leader = (*process)->pid();
  ASSERT_TRUE(wait_exit(**process).has_value());
  EXPECT_TRUE((*process)->remove_cgroup().ok());
  EXPECT_TRUE(wait_until([&] { return testing::live_processes_in_group(leader).empty(); }))
      << "the group's background sleep survived";
  EXPECT_TRUE(process_alive(stray)) << "a process outside the group is out of the group kill's reach";
  ::kill(stray, SIGKILL);
}

TEST(TaskCgroupsTest, ARestartedAgentKillsWhatAnEarlierRunLeftAndOnlyThat) {
  TestCgroups earlier;
  SKIP_WITHOUT_CGROUPS(earlier);
  TestCgroups other_agent;
  SKIP_WITHOUT_CGROUPS(other_agent);
  const std::string leftover = earlier.get()->path() + "/job-a.attempt-2.rank-1";
  const pid_t stray = leave_stray(leftover);
  ASSERT_GT(stray, 0) << "could not start a process in " << leftover;
  const std::string others = other_agent.get()->path() + "/job-a.attempt-2.rank-1";
  const pid_t others_task = leave_stray(others);
  ASSERT_GT(others_task, 0);

  // The restarted agent: the same key (its data directory) finds the same directory.
  TaskCgroupsOptions same;
  same.agent_key = earlier.key();
  StatusOr<std::shared_ptr<TaskCgroups>> restarted = TaskCgroups::open(same);
  ASSERT_TRUE(restarted.ok()) << restarted.status().to_string();
  EXPECT_EQ((*restarted)->path(), earlier.get()->path());
  std::vector<LeftoverCgroup> found = (*restarted)->remove_leftovers();
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].path, leftover);
  EXPECT_EQ(found[0].pids, std::vector<pid_t>{stray});
  EXPECT_TRUE(found[0].removed.ok()) << found[0].removed.to_string();
  EXPECT_TRUE(wait_until([&] { return !process_alive(stray); }))
      << "the leftover pid " << stray << " survived";
  EXPECT_FALSE(exists(leftover));
  // Another agent's task on the same machine is not this agent's leftover.
  EXPECT_TRUE(process_alive(others_task));
  EXPECT_TRUE(exists(others));
  end(stray);
}

TEST(TaskCgroupsTest, TheJobsUserCannotMoveOutOfItsCgroupOrRemoveIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "running a task as another user needs root";
  TestCgroups cgroups;
  SKIP_WITHOUT_CGROUPS(cgroups);
  StatusOr<UnixUser> user = lookup_unix_user(kDefaultJobUser);
  ASSERT_TRUE(user.ok()) << user.status().message() << " (deploy/install-deps.sh creates it)";
  PosixProcessLauncher launcher;
  launcher.set_task_cgroups(cgroups.get());
  // The agent's own cgroup: the common ancestor a move out would need to write.
  const std::string own = cgroups.get()->path().substr(0, cgroups.get()->path().rfind("/cohort-tasks/"));
  Collected out;
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c",
                  "cat /proc/self/cgroup | grep '^0::'; "
                  "echo $$ > \"$OWN/cgroup.procs\" 2>/dev/null && echo moved-out || echo move-refused; "
                  "echo 1 > \"$CG/cgroup.kill\" 2>/dev/null && echo killed || echo kill-refused; "
                  "rmdir \"$CG\" 2>/dev/null && echo removed || echo remove-refused"};
  options.run_as = *user;
  options.cgroup_name = "job-b.attempt-1.rank-0";
  const std::string cgroup = cgroups.get()->path() + "/" + options.cgroup_name;
  options.env = {"PATH=/usr/bin:/bin", "OWN=" + own, "CG=" + cgroup};
  options.on_stdout = out.callback();
  auto process = launcher.launch(options);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  std::optional<ExitStatus> exit = wait_exit(**process);
  ASSERT_TRUE(exit.has_value());
  ASSERT_TRUE((*process)->wait_output_closed(kTestWaitTimeout));
  const std::string text = out.get();
  // It ran in its cgroup (moved in before it became the job's user), and stayed there.
  EXPECT_NE(text.find("/cohort-tasks/"), std::string::npos) << text;
  EXPECT_NE(text.find("/job-b.attempt-1.rank-0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("move-refused"), std::string::npos) << text;
  EXPECT_NE(text.find("kill-refused"), std::string::npos) << text;
  EXPECT_NE(text.find("remove-refused"), std::string::npos) << text;
  struct stat info {};
  ASSERT_EQ(::stat(cgroup.c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, 0u);
  EXPECT_EQ(info.st_mode & 0022, 0u) << "the cgroup is writable by others";
  EXPECT_TRUE((*process)->remove_cgroup().ok());
}

TEST(OwnCgroupDirectoryTest, JoinsTheCgroup2MountWithTheProcesssCgroup) {
  TempDir dir;
  const std::string mountinfo = dir.path() + "/mountinfo";
  const std::string cgroup = dir.path() + "/cgroup";
  auto write = [](const std::string& path, const std::string& text) { std::ofstream(path) << text; };
  // A hybrid host: v1 controllers, cgroup2 at /sys/fs/cgroup/unified.
  write(mountinfo,
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
        "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n");
  write(cgroup, "4:memory:/system.slice\n0::/system.slice/cohortd.service\n");
  StatusOr<std::string> hybrid = own_cgroup_directory(mountinfo, cgroup);
  ASSERT_TRUE(hybrid.ok()) << hybrid.status().to_string();
  EXPECT_EQ(*hybrid, "/sys/fs/cgroup/unified/system.slice/cohortd.service");
  // A pure cgroup v2 host, the agent in the root cgroup.
  write(mountinfo, "25 23 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
  write(cgroup, "0::/\n");
  EXPECT_EQ(own_cgroup_directory(mountinfo, cgroup).value_or(""), "/sys/fs/cgroup");
  // A mount of a subtree (a container's view): the path is taken relative to the mount's root.
  write(mountinfo, "25 23 0:22 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  write(cgroup, "0::/kubepods/pod1/agent\n");
  EXPECT_EQ(own_cgroup_directory(mountinfo, cgroup).value_or(""), "/sys/fs/cgroup/agent");
  // A subtree that does not hold the agent, and no cgroup2 at all: errors that say what is missing.
  write(cgroup, "0::/elsewhere\n");
  StatusOr<std::string> outside = own_cgroup_directory(mountinfo, cgroup);
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("/elsewhere"), std::string::npos) << outside.status().message();
  write(mountinfo, "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n");
  StatusOr<std::string> none = own_cgroup_directory(mountinfo, cgroup);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("no cgroup2"), std::string::npos) << none.status().message();
  write(cgroup, "4:memory:/\n");
  EXPECT_FALSE(own_cgroup_directory(mountinfo, cgroup).ok());
  // In a cgroup namespace, a process moved out of the namespace's root sees "/../x": no directory
  // below the mount, and never one outside it.
  write(mountinfo, "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
  for (const char* line : {"0::/../agent\n", "0::/a/../../agent\n", "0::/..\n"}) {
    write(cgroup, line);
    StatusOr<std::string> outside_namespace = own_cgroup_directory(mountinfo, cgroup);
    ASSERT_FALSE(outside_namespace.ok()) << line << " gave " << outside_namespace.value_or("");
    EXPECT_EQ(outside_namespace.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(outside_namespace.status().message().find("cgroup namespace"), std::string::npos)
        << outside_namespace.status().message();
  }
  // ".." only as a whole component: a name that merely starts with dots is a name.
  write(cgroup, "0::/..agent/x..\n");
  EXPECT_EQ(own_cgroup_directory(mountinfo, cgroup).value_or(""), "/sys/fs/cgroup/unified/..agent/x..");
}

// Where no cgroup v2 is usable the agent gets an error saying what it looked for, and keeps
// process groups (WithoutCgroupsOnlyTheProcessGroupDiesWithTheTask shows what they still do).
TEST(OwnCgroupDirectoryTest, WithoutACgroup2MountThereAreNoTaskCgroups) {
  TempDir dir;
  TaskCgroupsOptions options;
  options.agent_key = dir.path();
  options.mountinfo_path = dir.path() + "/mountinfo";
  options.self_cgroup_path = dir.path() + "/cgroup";
  std::ofstream(options.mountinfo_path)
      << "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
  std::ofstream(options.self_cgroup_path) << "4:memory:/\n0::/\n";
  StatusOr<std::shared_ptr<TaskCgroups>> cgroups = TaskCgroups::open(options);
  ASSERT_FALSE(cgroups.ok());
  EXPECT_EQ(cgroups.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(cgroups.status().message().find(options.mountinfo_path), std::string::npos)
      << cgroups.status().message();
  options.agent_key = "";
  EXPECT_EQ(TaskCgroups::open(options).status().code(), StatusCode::kInvalidArgument);
}

// The agent's key is its data directory however it was written, so a restarted agent whose
// data_dir gained or lost a trailing '/' (or is given relative) finds what it left.
TEST(OwnCgroupDirectoryTest, TheAgentKeyIsTheDataDirectorysCanonicalPath) {
  TempDir dir;
  const std::string data = dir.path() + "/cohort";
  ASSERT_EQ(::mkdir(data.c_str(), 0700), 0);
  const std::string key = agent_key_for_data_dir(data);
  EXPECT_EQ(agent_key_for_data_dir(data + "/"), key);
  EXPECT_EQ(agent_key_for_data_dir(data + "//"), key);
  EXPECT_EQ(agent_key_for_data_dir(dir.path() + "/./other/../cohort"), key);
  EXPECT_EQ(cgroup_name_for(agent_key_for_data_dir(data + "/")), cgroup_name_for(key));
  // A directory that does not exist yet (the agent makes it later) keeps its written form.
  EXPECT_EQ(agent_key_for_data_dir(data + "/later/"), key + "/later");
  EXPECT_EQ(agent_key_for_data_dir("/"), "/");
  // Relative: from the working directory.
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_EQ(agent_key_for_data_dir("relative-data"), agent_key_for_data_dir(std::string(cwd) + "/relative-data"));
  EXPECT_EQ(agent_key_for_data_dir("relative-data").front(), '/');
}

TEST(OwnCgroupDirectoryTest, NamesAreReadableStableAndDistinct) {
  EXPECT_EQ(cgroup_name_for("/var/lib/cohort"), cgroup_name_for("/var/lib/cohort"));
  EXPECT_EQ(cgroup_name_for("/var/lib/cohort").rfind("var-lib-cohort-", 0), 0u)
      << cgroup_name_for("/var/lib/cohort");
  // Same readable part, different keys.
  EXPECT_NE(cgroup_name_for("/a/b"), cgroup_name_for("/a-b"));
  const std::string long_name = cgroup_name_for("/" + std::string(300, 'x'));
  EXPECT_LE(long_name.size(), 255u);
}

}  // namespace
}  // namespace cohort::agent
