#pragma once

// Test helpers for the stores: scratch directories, forked child processes with a time limit,
// and a free port for tests that must start a server later.

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "worker/comm/deadline.h"

namespace cohort::comm::testing {

// Limit for a test's forked children: generous for a loaded 2-core machine, still finite.
inline constexpr Duration kChildProcessTimeout = std::chrono::seconds(60);

// A fresh directory made by mkdtemp under $TEST_TMPDIR (Bazel's per-test scratch) or /tmp;
// removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // "<path>/<name>".
  std::string file(std::string_view name) const;

 private:
  std::string path_;
};

// Forks `count` children; child i runs `body(i)` and exits with its return value (0 = success)
// without running the parent's atexit handlers or gtest teardown. Waits for all of them up to
// `timeout`, then SIGKILLs the stragglers. Returns one line per child that did not exit 0, e.g.
// "child 2: exited with 1", "child 0: killed after 60.0 s" (empty: all succeeded).
std::vector<std::string> run_children(int count, const std::function<int(int)>& body,
                                      Duration timeout = kChildProcessTimeout);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read, closed), for tests
// that start a server later on purpose. Another process could take it in between; tests that
// can bind port 0 themselves should.
int pick_free_port();

}  // namespace cohort::comm::testing
