#include "worker/base/process_liveness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace cohort {
namespace {

// A child that sleeps until killed; its name holds the characters that make /proc/<pid>/stat
// hard to split (spaces and parentheses).
pid_t spawn_sleeper() {
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_NAME, "a) b (c", 0, 0, 0);
    for (;;) pause();
  }
  return pid;
}

// The child's identity once its new name shows (it is set after fork returns in the parent).
ProcessIdentity identity_of(pid_t pid) {
  ProcessIdentity process;
  process.pid = static_cast<int>(pid);
  char state = '?';
  for (int i = 0; i < 200; ++i) {
    if (read_proc_stat(pid, &state, &process.start_time)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return process;
}

TEST(ProcessLivenessTest, ThisProcessIsVisibleAndNotGone) {
  ProcessIdentity self = this_process();
  EXPECT_EQ(self.pid, static_cast<int>(getpid()));
  EXPECT_NE(self.start_time, 0u);
  EXPECT_EQ(self.boot_id.size(), 36u) << self.boot_id;
  EXPECT_NE(self.pid_namespace, 0u);
  EXPECT_TRUE(self.same_pid_space(this_process()));
  ProcessIdentity elsewhere = self;
  elsewhere.pid_namespace += 1;  // another pid namespace: its pids mean nothing here
  EXPECT_FALSE(self.same_pid_space(elsewhere));
  elsewhere = self;
  elsewhere.boot_id = "another-host";
  EXPECT_FALSE(self.same_pid_space(elsewhere));
  EXPECT_TRUE(process_visible(self));
  EXPECT_FALSE(process_gone(self));
}

TEST(ProcessLivenessTest, AnotherStartTimeIsAnotherProcess) {
  ProcessIdentity other = this_process();
  other.start_time += 1;  // the same pid, started at another time: a reused pid
  EXPECT_FALSE(process_visible(other));
  EXPECT_TRUE(process_gone(other));
}

TEST(ProcessLivenessTest, StoppedIsNotGoneZombieAndReapedAre) {
  pid_t pid = spawn_sleeper();
  ASSERT_GT(pid, 0);
  ProcessIdentity child = identity_of(pid);
  ASSERT_NE(child.start_time, 0u);
  EXPECT_TRUE(process_visible(child));
  EXPECT_FALSE(process_gone(child));

  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, WUNTRACED), pid);
  ASSERT_TRUE(WIFSTOPPED(status));
  EXPECT_FALSE(process_gone(child)) << "a stopped process still runs";

  ASSERT_EQ(kill(pid, SIGKILL), 0);
  // Not reaped yet: a zombie, gone already. waitid with WNOWAIT leaves it a zombie.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT), 0);
  char state = '?';
  uint64_t start = 0;
  ASSERT_TRUE(read_proc_stat(pid, &state, &start));
  EXPECT_EQ(state, 'Z');
  EXPECT_TRUE(process_gone(child));
  EXPECT_FALSE(process_visible(child));

  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_FALSE(read_proc_stat(pid, &state, &start));
  EXPECT_TRUE(process_gone(child));
}

TEST(ProcessLivenessTest, AnUnreadableEntryIsNotGone) {
  // Out of file descriptors: /proc cannot be opened, which says nothing about the process.
  ProcessIdentity self = this_process();
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  std::vector<int> fds;
  rlimit tight = saved;
  tight.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  for (int fd; (fd = open("/dev/null", O_RDONLY)) >= 0;) fds.push_back(fd);
  const int exhausted = errno;
  const bool gone = process_gone(self);
  for (int fd : fds) close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_EQ(exhausted, EMFILE);
  EXPECT_FALSE(gone) << "EMFILE was taken for an exit";
}

TEST(ProcessLivenessTest, NoSuchPid) {
  ProcessIdentity none;
  none.start_time = 1;
  EXPECT_TRUE(process_gone(none));
  EXPECT_FALSE(process_visible(none));
  ProcessIdentity unknown;
  unknown.pid = static_cast<int>(getpid());
  EXPECT_FALSE(process_visible(unknown)) << "start time 0 is unknown";
}

}  // namespace
}  // namespace cohort
