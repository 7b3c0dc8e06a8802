#pragma once

// Helpers for the agent's tests: a mkdtemp directory, polling with a deadline, a look into
// /proc for processes left in a process group, and task cgroups of a test's own.

#include <dirent.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "daemon/agent/task_cgroups.h"
#include "daemon/coordinator/temp_dir.h"

namespace cohort::agent::testing {

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

// The task cgroups of one test: a directory under a key of its own (tests run side by side in
// one cgroup), opened at construction. Where this machine has no cgroup v2 the test's user may
// write (a non-root run), get() is nullptr and skip_reason says why: the test then skips. The
// destructor kills and removes every cgroup the test left, even after a failed assertion; declare
// it before the launcher and the handles, so they go first.
class TestCgroups {
 public:
  explicit TestCgroups(TaskCgroupsOptions options = {}) {
    static std::atomic<int> next{0};
    options.agent_key = "cohort-test-" + std::to_string(::getpid()) + "-" + std::to_string(next++);
    key_ = options.agent_key;
    StatusOr<std::shared_ptr<TaskCgroups>> opened = TaskCgroups::open(options);
    if (opened.ok()) {
      cgroups_ = *opened;
    } else {
      skip_reason_ = "no writable cgroup v2 for task containment here (uid " + std::to_string(::geteuid()) +
                     "): " + opened.status().message();
    }
  }
  ~TestCgroups() {
    if (cgroups_ != nullptr) cgroups_->remove_leftovers();
  }
  TestCgroups(const TestCgroups&) = delete;
  TestCgroups& operator=(const TestCgroups&) = delete;

  const std::shared_ptr<TaskCgroups>& get() const { return cgroups_; }
  const std::string& skip_reason() const { return skip_reason_; }
  const std::string& key() const { return key_; }  // TaskCgroupsOptions::agent_key

 private:
  std::string key_;
  std::shared_ptr<TaskCgroups> cgroups_;
  std::string skip_reason_;
};

}  // namespace cohort::agent::testing
