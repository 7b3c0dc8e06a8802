#include "daemon/agent/process_launcher.h"

#include <signal.h>

#include <memory>
#include <mutex>
#include <string>

#include <gtest/gtest.h>

#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

using testing::kTestWaitTimeout;
using testing::TempDir;
using testing::wait_until;

// Collects a stream's bytes from the reader thread.
struct Collected {
  std::mutex mu;
  std::string bytes;
  OutputCallback callback() {
    return [this](std::string_view chunk) {
      std::lock_guard<std::mutex> lock(mu);
      bytes.append(chunk);
    };
  }
  std::string get() {
    std::lock_guard<std::mutex> lock(mu);
    return bytes;
  }
};

std::optional<ExitStatus> wait_exit(ProcessHandle& process) {
  std::optional<ExitStatus> exit;
  wait_until([&] { return (exit = process.poll_exit()).has_value(); });
  return exit;
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

TEST(PosixProcessLauncherTest, PassesExactlyTheGivenEnvironmentAndWorkingDir) {
  TempDir dir;
  Collected out;
  LaunchOptions options;
  options.argv = {"/bin/sh", "-c", "echo \"$COHORT_TEST_VALUE $HOME_IS_SET\"; pwd"};
  options.env = {"COHORT_TEST_VALUE=hello world"};
  options.working_dir = dir.path();
  options.on_stdout = out.callback();
  PosixProcessLauncher launcher;
  auto process = launcher.launch(options);
  ASSERT_TRUE(process.ok()) << process.status().to_string();
  ASSERT_TRUE(wait_exit(**process).has_value());
  ASSERT_TRUE((*process)->wait_output_closed(kTestWaitTimeout));
  EXPECT_EQ(out.get(), "hello world \n" + std::filesystem::canonical(dir.path()).string() + "\n");
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

}  // namespace
}  // namespace cohort::agent
