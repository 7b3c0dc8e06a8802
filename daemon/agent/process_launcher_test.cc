#include "daemon/agent/process_launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

using testing::Collected;
using testing::kTestWaitTimeout;
using testing::TempDir;
using testing::wait_until;

std::optional<ExitStatus> wait_exit(ProcessHandle& process) {
  std::optional<ExitStatus> exit;
  wait_until([&] { return (exit = process.poll_exit()).has_value(); });
  return exit;
}

// Launches `options` and returns what it printed on stdout once it has exited and its output is
// closed; gtest failures (and an empty string) when it could not be launched or did not end.
std::string stdout_of(LaunchOptions options) {
  Collected out;
  options.on_stdout = out.callback();
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  EXPECT_TRUE(process.ok()) << process.status().to_string();
  if (!process.ok()) return "";
  EXPECT_TRUE(wait_exit(**process).has_value());
  EXPECT_TRUE((*process)->wait_output_closed(kTestWaitTimeout));
  return out.get();
}

TEST(PosixProcessLauncherTest, CapturesBothStreamsAndExitCode) {
  Collected out;
  Collected err;
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", "echo out; echo err 1>&2; exit 3"};
  options.on_stdout = out.callback();
  options.on_stderr = err.callback();
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  EXPECT_EQ((*process)->pgid(), (*process)->pid());
  std::optional<ExitStatus> exit = wait_exit(**process);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 3);
  EXPECT_EQ(exit->signal, 0);
  EXPECT_EQ(exit->to_string(), "exit code 3");
  ASSERT_TRUE((*process)->wait_output_closed(kTestWaitTimeout));
  EXPECT_EQ(out.get(), "out\n");
  EXPECT_EQ(err.get(), "err\n");
}

TEST(PosixProcessLauncherTest, ADescriptorTheAgentOpenedWithoutCloseOnExecDoesNotReachTheTask) {
  // As an agent thread reading a file with std::ifstream (no O_CLOEXEC) at the moment of a fork.
  const int leaked = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(leaked, 3);
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", "if [ -e /proc/$$/fd/" + std::to_string(leaked) + " ]; then echo open; else echo closed; fi"};
  const std::string out = stdout_of(options);
  ::close(leaked);
  EXPECT_EQ(out, "closed\n");
}

TEST(PosixProcessLauncherTest, PassesExactlyTheGivenEnvironmentAndWorkingDir) {
  TempDir dir;
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", "echo \"$COHORT_TEST_VALUE $HOME_IS_SET\"; pwd"};
  options.env = {"COHORT_TEST_VALUE=hello world"};
  options.working_dir = dir.path();
  EXPECT_EQ(stdout_of(options), "hello world \n" + std::filesystem::canonical(dir.path()).string() + "\n");
}

TEST(PosixProcessLauncherTest, MissingBinaryIsAnErrorNamingThePath) {
  LaunchOptions options;
  options.argv = {"/nonexistent/cohort-worker", "--flag"};
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  ASSERT_FALSE(process.ok());
  EXPECT_EQ(process.status().code(), StatusCode::kNotFound);
  EXPECT_NE(process.status().message().find("/nonexistent/cohort-worker"), std::string::npos)
      << process.status().message();
}

TEST(PosixProcessLauncherTest, MissingWorkingDirIsAnError) {
  LaunchOptions options;
  options.argv = {"/bin/true"};
  options.working_dir = "/nonexistent/dir";
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  ASSERT_FALSE(process.ok());
  EXPECT_NE(process.status().message().find("/nonexistent/dir"), std::string::npos)
      << process.status().message();
}

TEST(PosixProcessLauncherTest, EmptyArgvIsInvalid) {
  PosixProcessLauncher launcher;
  auto process = launcher.launch(LaunchOptions{});
  ASSERT_FALSE(process.ok());
  EXPECT_EQ(process.status().code(), StatusCode::kInvalidArgument);
}

// A child that never reaches execve (as one whose chdir or execve hangs on a dead NFS mount):
// the launch gives up at exec_timeout with DEADLINE_EXCEEDED naming the directory and the path,
// the child is killed, and the launcher serves the next launch, even one that started meanwhile.
TEST(PosixProcessLauncherTest, ChildThatNeverExecsIsKilledAtTheExecDeadline) {
  TempDir dir;
  PosixProcessLauncher launcher;
  LaunchOptions hung;
  hung.argv = {"/bin/true"};
  hung.working_dir = dir.path();
  hung.exec_timeout = std::chrono::milliseconds(1500);
  testing_hooks::child_hangs_before_exec = true;
  const auto started = std::chrono::steady_clock::now();
  StatusOr<std::unique_ptr<ProcessHandle>> result = internal_error("not launched");
  std::thread hung_launch([&] { result = launcher.launch(hung); });
  // A second launch while the first still waits for its child goes through (the fork thread
  // does not wait for execs); it has no working directory, so the hook lets it exec.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  LaunchOptions quick;
  quick.argv = {"/bin/sh", "-c", "exit 3"};
  auto other = launcher.launch(quick);
  const auto other_done = std::chrono::steady_clock::now();
  hung_launch.join();
  const auto elapsed = std::chrono::steady_clock::now() - started;
  testing_hooks::child_hangs_before_exec = false;

  ASSERT_TRUE(other.ok()) << other.status().to_string();
  EXPECT_LT(other_done - started, std::chrono::milliseconds(1400)) << "the second launch waited for the first";
  auto exit = wait_exit(**other);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 3);

  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), StatusCode::kDeadlineExceeded) << result.status().to_string();
  const std::string message = result.status().message();
  EXPECT_NE(message.find(dir.path()), std::string::npos) << message;
  EXPECT_NE(message.find("/bin/true"), std::string::npos) << message;
  EXPECT_NE(message.find("hung mount"), std::string::npos) << message;
  EXPECT_GE(elapsed, std::chrono::milliseconds(1500));
  EXPECT_LT(elapsed, std::chrono::seconds(10));
  // The child named in the message is gone (killed, and reaped by the launcher).
  const size_t at = message.find("(pid ");
  ASSERT_NE(at, std::string::npos) << message;
  const pid_t pid = static_cast<pid_t>(std::stol(message.substr(at + 5)));
  EXPECT_TRUE(wait_until([&] { return ::kill(pid, 0) != 0 && errno == ESRCH; })) << "pid " << pid << " remains";
}

TEST(PosixProcessLauncherTest, SignalGroupKillsChildAndGrandchild) {
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", "sleep 100 & wait"};
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  pid_t pgid = (*process)->pgid();
  ASSERT_TRUE(wait_until([&] { return testing::live_processes_in_group(pgid).size() >= 2; }));
  ASSERT_TRUE((*process)->signal_group(SIGKILL).ok());
  std::optional<ExitStatus> exit = wait_exit(**process);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_TRUE(wait_until([&] { return testing::live_processes_in_group(pgid).empty(); }));
  // The group is gone; signalling it again is not an error.
  EXPECT_TRUE((*process)->signal_group(SIGTERM).ok());
}

#ifdef SYS_clone3
// clone3's arguments up to cgroup (CLONE_ARGS_SIZE_VER2), spelled out: <linux/sched.h> clashes
// with glibc's <sched.h>.
struct CloneArgs {
  uint64_t flags = 0;
  uint64_t pidfd = 0;
  uint64_t child_tid = 0;
  uint64_t parent_tid = 0;
  uint64_t exit_signal = 0;
  uint64_t stack = 0;
  uint64_t stack_size = 0;
  uint64_t tls = 0;
  uint64_t set_tid = 0;
  uint64_t set_tid_size = 0;
  uint64_t cgroup = 0;
};
#endif

// Once the leader is reaped its id may be reused, by an unrelated process and its group: then
// signal_group must send nothing (the agent is root, so it could signal anyone). clone3's set_tid
// reuses the id on purpose, at once, instead of waiting for the pids to wrap.
TEST(PosixProcessLauncherTest, SignalGroupSendsNothingOnceTheExitIsCollected) {
#ifndef SYS_clone3
  GTEST_SKIP() << "no clone3 on this system";
#else
  if (::geteuid() != 0) GTEST_SKIP() << "choosing a pid (clone3 set_tid) needs CAP_SYS_ADMIN";
  LaunchOptions options;
  options.argv = {"/bin/true"};
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  ASSERT_TRUE(wait_exit(**process).has_value());
  const pid_t reaped = (*process)->pgid();

  // An unrelated process whose pid and process group id are the reaped leader's.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t wanted = reaped;
  CloneArgs args;
  args.exit_signal = SIGCHLD;
  args.set_tid = reinterpret_cast<uint64_t>(&wanted);
  args.set_tid_size = 1;
  const long other = ::syscall(SYS_clone3, &args, sizeof(args));
  if (other == 0) {
    // Only system calls here: this is a raw clone of a threaded process.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::setpgid(0, 0);
    if (::write(ready[1], "x", 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  const int clone_errno = errno;
  ::close(ready[1]);
  if (other < 0) {
    ::close(ready[0]);
    GTEST_SKIP() << "clone3(set_tid=" << reaped << ") failed: " << std::strerror(clone_errno)
                 << " (the id was taken again, or the kernel is older than 5.5)";
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(other, reaped);
  ASSERT_EQ(::getpgid(static_cast<pid_t>(other)), reaped);

  EXPECT_TRUE((*process)->signal_group(SIGKILL).ok());
  EXPECT_TRUE((*process)->signal_group(SIGTERM).ok());
  // A signal sent would have ended it (SIGKILL is acted on at once; 200 ms covers the scheduler).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int status = 0;
  EXPECT_EQ(::waitpid(static_cast<pid_t>(other), &status, WNOHANG), 0)
      << "the unrelated group " << reaped << " was signalled after its id's previous owner was reaped";
  ::kill(static_cast<pid_t>(other), SIGKILL);
  ::waitpid(static_cast<pid_t>(other), &status, 0);
#endif
}

// A rank that exits (or is killed alone, as SIGKILL of its pid does) while a child it started still
// runs: the child goes with it, so nothing of the task outlives its exit report.
TEST(PosixProcessLauncherTest, WhatTheLeaderLeftBehindIsKilledWhenItExits) {
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", "sleep 100 & sleep 100 & exec sleep 100"};
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  pid_t pgid = (*process)->pgid();
  ASSERT_TRUE(wait_until([&] { return testing::live_processes_in_group(pgid).size() >= 3; }));
  ASSERT_EQ(::kill((*process)->pid(), SIGKILL), 0);  // the leader only
  std::optional<ExitStatus> exit = wait_exit(**process);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_TRUE(wait_until([&] { return testing::live_processes_in_group(pgid).empty(); }))
      << testing::live_processes_in_group(pgid).size() << " process(es) of the group outlived its leader";
}

TEST(PosixProcessLauncherTest, DestroyingARunningHandleKillsTheGroup) {
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", "sleep 100 & wait"};
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  pid_t pgid = (*process)->pgid();
  ASSERT_TRUE(wait_until([&] { return testing::live_processes_in_group(pgid).size() >= 2; }));
  process = Status(StatusCode::kCancelled, "dropped");  // destroys the handle
  EXPECT_TRUE(wait_until([&] { return testing::live_processes_in_group(pgid).empty(); }));
}

// "soft hard" of the limit named `name` in /proc/<pid>/limits.
std::string limit_values(pid_t pid, const std::string& name) {
  std::istringstream lines(testing::read_file("/proc/" + std::to_string(pid) + "/limits"));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name + " ", 0) != 0) continue;
    std::istringstream fields(line.substr(name.size()));
    std::string soft;
    std::string hard;
    fields >> soft >> hard;
    return soft + " " + hard;
  }
  return "";
}

// The value of `field` ("Uid:", "NoNewPrivs:") in /proc/<pid>/status, or "" if absent.
std::string status_field(pid_t pid, const std::string& field) {
  std::string status = testing::read_file("/proc/" + std::to_string(pid) + "/status");
  size_t at = status.find("\n" + field);
  if (at == std::string::npos) return "";
  size_t start = status.find_first_not_of(" \t", at + 1 + field.size());
  return status.substr(start, status.find('\n', start) - start);
}

TEST(PosixProcessLauncherTest, ChildHasNoNewPrivsLimitsAndADeathSignal) {
  LaunchOptions options;
  options.argv = {"/bin/sleep", "30"};
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  const pid_t pid = (*process)->pid();
  // The fields appear once exec is done; launch() returned after it.
  EXPECT_EQ(status_field(pid, "NoNewPrivs:"), "1");
  EXPECT_EQ(limit_values(pid, "Max core file size"), "0 0");
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  const rlim_t open_files =
      files.rlim_max == RLIM_INFINITY ? kChildMaxOpenFiles : std::min(kChildMaxOpenFiles, files.rlim_max);
  EXPECT_EQ(limit_values(pid, "Max open files"), std::to_string(open_files) + " " + std::to_string(open_files));
}

TEST(PosixProcessLauncherTest, RunsAsTheGivenUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  StatusOr<UnixUser> user = lookup_unix_user(kDefaultJobUser);
  ASSERT_TRUE(user.ok()) << user.status().message() << " (deploy/install-deps.sh creates it)";
  TempDir dir;
  LaunchOptions options;
  options.argv = {"/bin/sleep", "30"};
  options.run_as = *user;
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  const std::string uid = std::to_string(user->uid);
  // Real, effective, saved and file-system uid: all the job user's, none root.
  EXPECT_EQ(status_field((*process)->pid(), "Uid:"), uid + "\t" + uid + "\t" + uid + "\t" + uid);
  EXPECT_EQ(status_field((*process)->pid(), "NoNewPrivs:"), "1");

  // A directory the user cannot enter (mkdtemp's 0700 root) is a launch error naming the user.
  options.working_dir = dir.path();
  ::chmod(dir.path().c_str(), 0700);
  auto refused = launcher.launch(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(kDefaultJobUser), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find(dir.path()), std::string::npos) << refused.status().message();
}

TEST(PosixProcessLauncherTest, ChildOutlivesTheThreadThatAskedForIt) {
  // PR_SET_PDEATHSIG follows the forking thread: launches come from short-lived (gRPC) threads,
  // and their children must not be killed when those threads end.
  PosixProcessLauncher launcher;
  Collected out;
  std::unique_ptr<ProcessHandle> process;
  std::thread caller([&] {
    LaunchOptions options;
    options.argv = {"/bin/sh", "-c", "sleep 0.3; echo alive"};
    options.on_stdout = out.callback();
    auto launched = launcher.launch(options);
    if (launched.ok()) process = std::move(launched).value();
  });
  caller.join();
  ASSERT_NE(process, nullptr);
  std::optional<ExitStatus> exit = wait_exit(*process);
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->success()) << exit->to_string();
  ASSERT_TRUE(process->wait_output_closed(kTestWaitTimeout));
  EXPECT_EQ(out.get(), "alive\n");
}

TEST(PosixProcessLauncherTest, ChildDiesWithTheLauncherProcess) {
  int pids[2];
  ASSERT_EQ(::pipe(pids), 0);
  const pid_t launcher_process = ::fork();
  ASSERT_GE(launcher_process, 0);
  if (launcher_process == 0) {
    // A launcher in a process of its own, which then waits to be killed.
    ::close(pids[0]);
    PosixProcessLauncher launcher;
    LaunchOptions options;
    options.argv = {"/bin/sleep", "60"};
    auto process = launcher.launch(options);
    pid_t pid = process.ok() ? (*process)->pid() : -1;
    if (::write(pids[1], &pid, sizeof(pid)) != sizeof(pid)) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  ::close(pids[1]);
  pid_t worker = -1;
  ASSERT_EQ(::read(pids[0], &worker, sizeof(worker)), static_cast<ssize_t>(sizeof(worker)));
  ::close(pids[0]);
  ASSERT_GT(worker, 0);
  ASSERT_EQ(::kill(launcher_process, SIGKILL), 0);
  int wait_status = 0;
  ASSERT_EQ(::waitpid(launcher_process, &wait_status, 0), launcher_process);
  // The worker was re-parented (to init or a subreaper, which reaps it): gone or a zombie.
  EXPECT_TRUE(wait_until(
      [&] {
        std::string state = status_field(worker, "State:");
        return state.empty() || state[0] == 'Z';
      },
      std::chrono::seconds(2)))
      << "worker " << worker << " outlived its launcher: " << status_field(worker, "State:");
}

}  // namespace
}  // namespace cohort::agent
