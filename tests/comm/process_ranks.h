#pragma once

// Test helper: ranks as real processes. fork_ranks() forks one child per rank running
// `fn(rank)`, whose Status becomes the child's exit code (0 ok) and its message goes to a file
// the parent reads back. The parent waits with a deadline and SIGKILLs whatever is left, so a
// hung rank fails the test instead of hanging it.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"

namespace cohort::comm::testing {

struct RankOutcome {
  int exit_code = -1;   // -1: killed by a signal or by the deadline
  int signal = 0;       // the terminating signal, if any
  std::string message;  // the child's Status text ("OK" on success)
  Duration elapsed{0};  // from fork to exit
};

class ProcessRanks {
 public:
  // `dir` receives one result file per rank.
  explicit ProcessRanks(std::string dir) : dir_(std::move(dir)) {}

  // Forks `size` children running fn(rank); returns at once. The parent must not hold UCX state.
  void fork_ranks(int size, const std::function<Status(int rank)>& fn) {
    start_ = Clock::now();
    for (int rank = 0; rank < size; ++rank) {
      pid_t pid = fork();
      if (pid == 0) {
        Status status = fn(rank);
        std::ofstream(result_path(rank)) << status.to_string();
        std::fflush(nullptr);
        _exit(status.ok() ? 0 : 1);
      }
      pids_.push_back(pid);
    }
  }

  pid_t pid(int rank) const { return pids_[rank]; }

  // Waits for every child up to `timeout` in total, then SIGKILLs the rest.
  std::vector<RankOutcome> wait_all(Duration timeout) {
    std::vector<RankOutcome> outcomes(pids_.size());
    std::vector<bool> done(pids_.size(), false);
    Deadline deadline = Deadline::after(timeout);
    size_t remaining = pids_.size();
    while (remaining > 0) {
      for (size_t r = 0; r < pids_.size(); ++r) {
        if (done[r]) continue;
        int status = 0;
        bool expired = deadline.expired();
        if (expired) kill(pids_[r], SIGKILL);
        pid_t got = waitpid(pids_[r], &status, expired ? 0 : WNOHANG);
        if (got != pids_[r]) continue;
        done[r] = true;
        --remaining;
        outcomes[r].elapsed = std::chrono::duration_cast<Duration>(Clock::now() - start_);
        if (WIFEXITED(status)) outcomes[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) outcomes[r].signal = WTERMSIG(status);
        std::ifstream in(result_path(static_cast<int>(r)));
        std::stringstream text;
        text << in.rdbuf();
        outcomes[r].message = expired && !WIFEXITED(status) ? "killed at the test deadline" : text.str();
      }
      if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return outcomes;
  }

 private:
  std::string result_path(int rank) const { return dir_ + "/rank" + std::to_string(rank) + ".result"; }

  std::string dir_;
  std::vector<pid_t> pids_;
  Clock::time_point start_;
};

// "" when every rank exited 0, else one line per failed rank.
inline std::string failed_ranks(const std::vector<RankOutcome>& outcomes) {
  std::string out;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (outcomes[r].exit_code != 0) {
      out += "rank " + std::to_string(r) + ": exit " + std::to_string(outcomes[r].exit_code) + " signal " +
             std::to_string(outcomes[r].signal) + ": " + outcomes[r].message + "\n";
    }
  }
  return out;
}

}  // namespace cohort::comm::testing
