// Workers started by a real `cohort run` and by a real `cohortd --role all` (issue 11):
//   - with the launcher running as root, every worker has no uid 0 (real, effective, saved and
//     file-system) and NoNewPrivs 1;
//   - after SIGKILL of `cohort run`, or of cohortd, no worker is left 2 s later (PR_SET_PDEATHSIG).
// Workers are found in /proc by their environment: COHORT_JOB_ID names this test's unique job.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/agent/task_cgroups.h"
#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

using testing::read_file;
using testing::TempDir;
using testing::wait_until;

// In the test's runfiles.
constexpr const char* kCohort = "client/cohort";
constexpr const char* kCohortd = "daemon/cohortd";
constexpr const char* kWorker = "worker/runner/cohort-worker";
// From the submit to both workers exec'd (they are found by their command line, which exec sets,
// before libtorch loads), on a loaded 2-core machine.
constexpr auto kWorkersStartTimeout = std::chrono::seconds(30);
// The issue's bound: no worker is left this long after its launcher was killed.
constexpr auto kOrphanTimeout = std::chrono::seconds(2);

// Two ranks training for far longer than the test: they must be killed, not finish.
std::string long_job_yaml(const std::string& name) {
  return "name: " + name + R"(
nodes: 1
procs_per_node: 2
communicator: flat
dataset: {kind: synthetic, train_size: 4096, test_size: 64, input_shape: [64], num_classes: 4}
data_parallel:
  graph:
    layers:
      - {type: linear, in_features: 64, out_features: 32}
      - {type: relu}
      - {type: linear, in_features: 32, out_features: 4}
loss: cross_entropy
optimizer: {kind: sgd, lr: 0.01}
batch_size: 16
epochs: 100000
)";
}

std::string absolute(const std::string& runfile) {
  char* real = ::realpath(runfile.c_str(), nullptr);
  std::string path = real != nullptr ? real : runfile;
  std::free(real);
  return path;
}

// A process the test started; killed and reaped if the test ends early.
struct Child {
  pid_t pid = -1;
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  void kill_and_reap() {
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    ASSERT_EQ(::waitpid(pid, nullptr, 0), pid);
    pid = -1;
  }
};

// Starts `argv` with `env` added to this process's environment, output to `log`.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    for (const std::string& entry : env) ::putenv(const_cast<char*>(entry.c_str()));
    std::vector<char*> args;
    for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// The value of `field` ("Uid:") in /proc/<pid>/status; "" once the process is gone.
std::string status_field(pid_t pid, const std::string& field) {
  std::string status = read_file("/proc/" + std::to_string(pid) + "/status");
  size_t at = status.find("\n" + field);
  if (at == std::string::npos) return "";
  size_t start = status.find_first_not_of(" \t", at + 1 + field.size());
  return status.substr(start, status.find('\n', start) - start);
}

bool alive(pid_t pid) {
  std::string state = status_field(pid, "State:");
  return !state.empty() && state[0] != 'Z' && state[0] != 'X';
}

// Live cohort-worker processes whose environment has COHORT_JOB_ID=<job_id>.
std::vector<pid_t> workers_of(const std::string& job_id) {
  std::vector<pid_t> result;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return result;
  const std::string marker = "COHORT_JOB_ID=" + job_id;
  while (dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    const std::string proc = "/proc/" + std::string(entry->d_name);
    if (read_file(proc + "/cmdline").find("cohort-worker") == std::string::npos) continue;
    const std::string environ = read_file(proc + "/environ");
    size_t at = environ.find(marker);
    if (at == std::string::npos || (at > 0 && environ[at - 1] != '\0')) continue;
    if (at + marker.size() < environ.size() && environ[at + marker.size()] != '\0') continue;
    if (alive(static_cast<pid_t>(pid))) result.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(dir);
  return result;
}

// Waits for `count` workers of the job; they are past exec once their cmdline names the worker.
std::vector<pid_t> wait_for_workers(const std::string& job_id, size_t count, const std::string& log) {
  std::vector<pid_t> workers;
  bool found = wait_until([&] { return (workers = workers_of(job_id)).size() >= count; },
                          std::chrono::duration_cast<std::chrono::milliseconds>(kWorkersStartTimeout));
  EXPECT_TRUE(found) << "found " << workers.size() << " of " << count << " workers of " << job_id
                     << "; launcher output:\n"
                     << read_file(log);
  return workers;
}

void expect_unprivileged(const std::vector<pid_t>& workers) {
  ASSERT_EQ(::geteuid(), 0u) << "the test is about a launcher running as root";
  for (pid_t pid : workers) {
    std::istringstream uids(status_field(pid, "Uid:"));
    int fields = 0;
    for (long uid; uids >> uid; ++fields) EXPECT_NE(uid, 0) << "worker " << pid << " runs with a root uid";
    EXPECT_EQ(fields, 4) << "worker " << pid;
    EXPECT_EQ(status_field(pid, "NoNewPrivs:"), "1") << "worker " << pid;
  }
}

void expect_all_gone_soon(const std::vector<pid_t>& workers) {
  std::vector<pid_t> left;
  wait_until(
      [&] {
        left.clear();
        for (pid_t pid : workers) {
          if (alive(pid)) left.push_back(pid);
        }
        return left.empty();
      },
      std::chrono::duration_cast<std::chrono::milliseconds>(kOrphanTimeout));
  for (pid_t pid : left) {
    ADD_FAILURE() << "worker " << pid << " outlived its launcher by " << kOrphanTimeout.count() << " s";
    ::kill(pid, SIGKILL);
  }
}

class UnprivilegedWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "run as root (as CI does): the agent then switches users";
    // The job user must pass through the test's directory to reach its job directory.
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0711), 0);
  }
  std::string job_file(const std::string& name) {
    const std::string path = dir_.path() + "/" + name + ".yaml";
    std::ofstream(path) << long_job_yaml(name);
    return path;
  }

  TempDir dir_;
};

// A SIGKILLed agent cannot remove its tasks' cgroups (emptied, as its workers died with it):
// remove them as its next start would, so the test leaves nothing in the machine's cgroup tree.
void remove_task_cgroups(const std::string& data_dir) {
  TaskCgroupsOptions options;
  options.agent_key = agent_key_for_data_dir(data_dir);
  StatusOr<std::shared_ptr<TaskCgroups>> cgroups = TaskCgroups::open(options);
  if (!cgroups.ok()) return;  // no containment here, so the agent made none
  for (const LeftoverCgroup& left : (*cgroups)->remove_leftovers()) {
    EXPECT_TRUE(left.removed.ok()) << left.path << ": " << left.removed.to_string();
  }
}  // the TaskCgroups' destructor removes the agent's directory, and cohort-tasks when empty

TEST_F(UnprivilegedWorkersTest, CohortRunWorkersAreUnprivilegedAndDieWithIt) {
  const std::string name = "unpriv-run-" + std::to_string(::getpid());
  const std::string log = dir_.path() + "/cohort-run.log";
  Child run;
  // No --data-dir: `cohort run` makes its own temporary one (under TMPDIR), as a user's would.
  run.pid = spawn({absolute(kCohort), "run", job_file(name), "--worker", absolute(kWorker)},
                  {"TMPDIR=" + dir_.path()}, log);
  ASSERT_GT(run.pid, 0);
  std::vector<pid_t> workers = wait_for_workers(name + "-1", 2, log);
  ASSERT_EQ(workers.size(), 2u);
  expect_unprivileged(workers);
  run.kill_and_reap();
  expect_all_gone_soon(workers);
  // `cohort run`'s own data directory, which its SIGKILL left under TMPDIR.
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    if (entry.path().filename().string().rfind("cohort-run-", 0) == 0) remove_task_cgroups(entry.path().string());
  }
}

TEST_F(UnprivilegedWorkersTest, CohortdWorkersAreUnprivilegedAndDieWithIt) {
  const std::string name = "unpriv-daemon-" + std::to_string(::getpid());
  const std::string data_dir = dir_.path() + "/data";
  const std::string log = dir_.path() + "/cohortd.log";
  // As systemd's StateDirectory makes it (deploy/cohortd.service): searchable, not listable.
  ASSERT_EQ(::mkdir(data_dir.c_str(), 0711), 0);
  Child daemon;
  daemon.pid = spawn({absolute(kCohortd), "--role", "all", "--listen", "127.0.0.1:0", "--data-dir", data_dir,
                      "--slots", "2", "--worker", absolute(kWorker)},
                     {}, log);
  ASSERT_GT(daemon.pid, 0);
  // "listening on HOST:PORT" is its first line.
  std::string address;
  ASSERT_TRUE(wait_until(
      [&] {
        std::string text = read_file(log);
        size_t at = text.find("listening on ");
        if (at == std::string::npos) return false;
        size_t start = at + std::string("listening on ").size();
        size_t end = text.find_first_of(" \n", start);
        if (end == std::string::npos) return false;
        address = text.substr(start, end - start);
        return true;
      },
      std::chrono::seconds(30)))
      << read_file(log);
  // With authentication on, the first admin's credentials are in the data directory.
  const std::string credentials = data_dir + "/admin.credentials";
  std::vector<std::string> submit = {absolute(kCohort)};
  if (::access(credentials.c_str(), R_OK) == 0) {
    submit.insert(submit.end(), {"--credentials", credentials});
  } else {
    submit.insert(submit.end(), {"--coordinator", address});
  }
  submit.insert(submit.end(), {"submit", job_file(name)});
  const std::string submit_log = dir_.path() + "/submit.log";
  Child client;
  client.pid = spawn(submit, {}, submit_log);
  int status = 0;
  ASSERT_EQ(::waitpid(client.pid, &status, 0), client.pid);
  client.pid = -1;
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << read_file(submit_log);

  std::vector<pid_t> workers = wait_for_workers(name + "-1", 2, log);
  ASSERT_EQ(workers.size(), 2u);
  expect_unprivileged(workers);
  daemon.kill_and_reap();
  expect_all_gone_soon(workers);
  remove_task_cgroups(data_dir);
}

}  // namespace
}  // namespace cohort::agent
