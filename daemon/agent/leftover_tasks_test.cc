// An agent starting up finds and kills the processes an earlier run of it left behind (marked by
// COHORT_JOB_DIR under its job directory root), and nothing else.

#include "daemon/agent/leftover_tasks.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

// Starts `sleep 100` with COHORT_JOB_DIR=job_dir (none when empty); returns its pid.
pid_t spawn_sleeper(const std::string& job_dir) {
  std::string variable = std::string(kJobDirVariable) + "=" + job_dir;
  std::vector<char*> env = {const_cast<char*>("PATH=/usr/bin:/bin")};
  if (!job_dir.empty()) env.push_back(variable.data());
  env.push_back(nullptr);
  char* argv[] = {const_cast<char*>("/bin/sleep"), const_cast<char*>("100"), nullptr};
  pid_t pid = 0;
  EXPECT_EQ(::posix_spawn(&pid, "/bin/sleep", nullptr, nullptr, argv, env.data()), 0);
  return pid;
}

// Whether `pid` (a child of this test) was ended by SIGKILL within the test's wait.
bool killed(pid_t pid) {
  int status = 0;
  bool reaped = testing::wait_until([&] { return ::waitpid(pid, &status, WNOHANG) == pid; });
  return reaped && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

void end(pid_t pid) {
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

TEST(LeftoverTasksTest, OnlyProcessesUnderThisAgentsJobRootAreKilled) {
  testing::TempDir dir;
  const std::string root = dir.path() + "/jobs";
  const pid_t leftover = spawn_sleeper(root + "/train-3");
  const pid_t nested = spawn_sleeper(root + "/train-4/work");
  const pid_t other_agent = spawn_sleeper(dir.path() + "/other/jobs/train-3");
  const pid_t look_alike = spawn_sleeper(root + "2/train-3");  // shares the root's text, not the directory
  const pid_t the_root = spawn_sleeper(root);
  const pid_t unmarked = spawn_sleeper("");
  // The environment is readable once the child has exec'd.
  ASSERT_TRUE(testing::wait_until([&] { return find_leftover_tasks(root).size() == 2; }));

  std::vector<LeftoverTask> found = kill_leftover_tasks(root + "/");  // a trailing slash is fine
  ASSERT_EQ(found.size(), 2u);
  for (const LeftoverTask& task : found) {
    EXPECT_TRUE(task.pid == leftover || task.pid == nested) << task.pid;
    EXPECT_EQ(task.command, "/bin/sleep 100");
    EXPECT_EQ(task.job_dir.rfind(root + "/train-", 0), 0u) << task.job_dir;
  }
  EXPECT_TRUE(killed(leftover));
  EXPECT_TRUE(killed(nested));
  for (pid_t pid : {other_agent, look_alike, the_root, unmarked}) {
    EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), 0) << "pid " << pid << " was not this agent's and must live";
    end(pid);
  }
  EXPECT_TRUE(find_leftover_tasks(root).empty());
  EXPECT_TRUE(find_leftover_tasks("").empty());
}

}  // namespace
}  // namespace cohort::agent
