#pragma once

// Helpers for the agent's tests: a mkdtemp directory, polling with a deadline, and a look into
// /proc for processes left in a process group.

#include <dirent.h>
#include <stdlib.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "daemon/coordinator/temp_dir.h"

namespace cohort::agent::testing {

// Long enough for a loaded 2-core machine to fork and run a shell; tests finish far sooner.
inline constexpr std::chrono::milliseconds kTestWaitTimeout = std::chrono::seconds(20);

// A fresh directory for one test, removed afterwards (the coordinator tests' helper).
using TempDir = coordinator::testing::TempDir;

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

}  // namespace cohort::agent::testing
