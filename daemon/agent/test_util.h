#pragma once

// Helpers for the agent's tests: a mkdtemp directory, polling with a deadline, a look into
// /proc for processes left in a process group, and task cgroups of a test's own.

#include <dirent.h>
#include <stdlib.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "daemon/agent/process_launcher.h"
#include "daemon/agent/task_cgroups.h"
#include "daemon/coordinator/temp_dir.h"

namespace cohort::agent::testing {

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

// Long enough for a loaded 2-core machine to fork and run a shell; tests finish far sooner.
inline constexpr std::chrono::milliseconds kTestWaitTimeout = std::chrono::seconds(20);

// A fresh directory for one test, removed afterwards (the coordinator tests' helper).
using TempDir = coordinator::testing::TempDir;

// The line `body` returns when run in a forked child, sent back through a pipe: for checks that
// first change the process's identity or capabilities, which must not leak into the test.
inline std::string line_from_child(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return "fork failed";
  }
  if (child == 0) {
    ::close(fds[0]);
    const std::string line = body();
    const ssize_t written = ::write(fds[1], line.data(), line.size());
    ::_exit(written == static_cast<ssize_t>(line.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string line;
  char buffer[1024];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) line.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return line;
}

// Polls `condition` every few milliseconds until it holds or `timeout` passes.
inline bool wait_until(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = kTestWaitTimeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Live (not zombie) processes whose process group is `pgid`, from /proc/<pid>/stat.
inline std::vector<pid_t> live_processes_in_group(pid_t pgid) {
  std::vector<pid_t> result;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return result;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    std::string stat = read_file("/proc/" + std::string(entry->d_name) + "/stat");
    // "pid (comm) state ppid pgrp ...": comm may hold spaces, so parse after the last ')'.
    size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    char state = 0;
    long ppid = 0;
    long pgrp = 0;
    fields >> state >> ppid >> pgrp;
    if (pgrp == pgid && state != 'Z' && state != 'X') result.push_back(static_cast<pid_t>(pid));
  }
  closedir(dir);
  return result;
}

// Whether `pid` names a process that still runs (not a zombie waiting for its parent's wait).
inline bool process_alive(pid_t pid) {
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state != 'Z' && state != 'X';
}

// The agent key prefix of the tests' task cgroups: cohort-test-<pid>-<n>.
inline constexpr const char* kTestCgroupKeyPrefix = "cohort-test-";

// Kills and removes what earlier test processes that are gone now (a SIGKILLed or timed-out test)
// left in `tasks_dir` (<own cgroup>/cohort-tasks): the agent directories cohort-test-<pid>-<n>-<hash>
// whose <pid> runs no more, with the processes still in their task cgroups. A test that ends
// normally removes its own (TestCgroups); without this, a killed one's would stay forever. Returns
// the directories it removed.
inline std::vector<std::string> remove_dead_tests_cgroups(const std::string& tasks_dir) {
  std::vector<std::string> removed;
  std::vector<std::string> keys;
  DIR* dir = ::opendir(tasks_dir.c_str());
  if (dir == nullptr) return removed;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind(kTestCgroupKeyPrefix, 0) != 0) continue;
    // The directory is cgroup_name_for(key), key "cohort-test-<pid>-<n>" (all kept as it is).
    const size_t hash = name.rfind('-');
    if (hash == std::string::npos) continue;
    const std::string key = name.substr(0, hash);
    if (cgroup_name_for(key) != name) continue;
    char* end = nullptr;
    const long pid = std::strtol(key.c_str() + std::strlen(kTestCgroupKeyPrefix), &end, 10);
    if (pid <= 0 || end == nullptr || *end != '-') continue;
    // Alive (EPERM: alive, another user's): not a leftover. A pid reused since is left until later.
    if (pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    keys.push_back(key);
  }
  ::closedir(dir);
  for (const std::string& key : keys) {
    TaskCgroupsOptions options;
    options.agent_key = key;
    StatusOr<std::shared_ptr<TaskCgroups>> cgroups = TaskCgroups::open(options);
    if (!cgroups.ok()) continue;
    (*cgroups)->remove_leftovers();
    const std::string path = (*cgroups)->path();
    cgroups->reset();  // removes the agent directory, now empty
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) removed.push_back(path);
  }
  return removed;
}

// The task cgroups of one test: a directory under a key of its own (tests run side by side in
// one cgroup), opened at construction, after removing what killed earlier test processes left
// (remove_dead_tests_cgroups). get() is nullptr only where the facility is truly absent, and then
// skip_reason says why and the test skips: not root (a user's delegated cgroup is not assumed), or
// no cgroup2 mount holding this process's cgroup, or that mount read-only. Root with a cgroup2
// mount must get its cgroups: otherwise failure() says why and the test fails, so a regression in
// TaskCgroups::open cannot pass as a skip. The destructor kills and removes every cgroup the test
// left, even after a failed assertion; declare it before the launcher and the handles, so they go
// first.
class TestCgroups {
 public:
  explicit TestCgroups(TaskCgroupsOptions options = {}) {
    static std::atomic<int> next{0};
    options.agent_key = kTestCgroupKeyPrefix + std::to_string(::getpid()) + "-" + std::to_string(next++);
    key_ = options.agent_key;
    const std::string uid = "uid " + std::to_string(::geteuid());
    StatusOr<std::string> own = own_cgroup_directory(options.mountinfo_path, options.self_cgroup_path);
    if (!own.ok()) {
      skip_reason_ = "no cgroup v2 for task containment here (" + uid + "): " + own.status().message();
      return;
    }
    struct statvfs mount {};
    if (::statvfs(own->c_str(), &mount) == 0 && (mount.f_flag & ST_RDONLY) != 0) {
      skip_reason_ = "the cgroup2 mount holding " + *own + " is read-only here (" + uid + ")";
      return;
    }
    if (::geteuid() != 0) {
      skip_reason_ = "task cgroups need root here (" + uid + "; a delegated cgroup is not assumed)";
      return;
    }
    remove_dead_tests_cgroups(*own + "/" + kTaskCgroupsDirectory);
    StatusOr<std::shared_ptr<TaskCgroups>> opened = TaskCgroups::open(options);
    if (opened.ok()) {
      cgroups_ = *opened;
    } else {
      failure_ = "root with a cgroup2 mount at " + *own + ", yet TaskCgroups::open failed: " +
                 opened.status().to_string();
    }
  }
  ~TestCgroups() {
    if (cgroups_ != nullptr) cgroups_->remove_leftovers();
  }
  TestCgroups(const TestCgroups&) = delete;
  TestCgroups& operator=(const TestCgroups&) = delete;

  const std::shared_ptr<TaskCgroups>& get() const { return cgroups_; }
  const std::string& skip_reason() const { return skip_reason_; }
  // Why get() is nullptr where it should not be (root, cgroup2 present); empty otherwise.
  const std::string& failure() const { return failure_; }
  const std::string& key() const { return key_; }  // TaskCgroupsOptions::agent_key

 private:
  std::string key_;
  std::shared_ptr<TaskCgroups> cgroups_;
  std::string skip_reason_;
  std::string failure_;
};

// In a test: fails it when TestCgroups should have cgroups but has none, skips it when this
// machine has no facility for them.
#define COHORT_SKIP_WITHOUT_CGROUPS(cgroups)                                    \
  if ((cgroups).get() == nullptr) {                                             \
    if (!(cgroups).failure().empty()) FAIL() << (cgroups).failure();            \
    GTEST_SKIP() << (cgroups).skip_reason();                                    \
  }

}  // namespace cohort::agent::testing
