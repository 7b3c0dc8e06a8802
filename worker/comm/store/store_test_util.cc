#include "worker/comm/store/store_test_util.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "worker/comm/store/scoped_fd.h"

namespace cohort::comm::testing {
namespace {

// How often the parent looks for exited children.
constexpr Duration kChildPollInterval = std::chrono::milliseconds(5);

std::string describe_exit(int index, int status) {
  if (WIFEXITED(status)) return fmt::format("child {}: exited with {}", index, WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("child {}: killed by signal {}", index, WTERMSIG(status));
  return fmt::format("child {}: wait status {:#x}", index, status);
}

}  // namespace

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/cohort_store_XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp(" << pattern << ") failed";
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::file(std::string_view name) const { return path_ + "/" + std::string(name); }

std::vector<std::string> run_children(int count, const std::function<int(int)>& body, Duration timeout) {
  std::vector<pid_t> pids;
  for (int i = 0; i < count; ++i) {
    std::fflush(nullptr);  // or buffered output is written twice
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(body(i));
    if (pid < 0) return {fmt::format("fork of child {} failed", i)};
    pids.push_back(pid);
  }
  std::vector<std::string> failures;
  std::vector<bool> done(pids.size(), false);
  const Deadline deadline = Deadline::after(timeout);
  for (size_t left = pids.size(); left > 0;) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (done[i] || ::waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      done[i] = true;
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        failures.push_back(describe_exit(static_cast<int>(i), status));
    }
    if (left == 0) break;
    if (deadline.expired()) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (done[i]) continue;
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], nullptr, 0);  // SIGKILL cannot be ignored: returns promptly
        failures.push_back(fmt::format("child {}: killed after {}", i, format_duration(timeout)));
      }
      break;
    }
    std::this_thread::sleep_for(kChildPollInterval);
  }
  return failures;
}

int pick_free_port() {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t size = sizeof(address);
  if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    ADD_FAILURE() << "cannot bind 127.0.0.1:0";
    return 0;
  }
  return ntohs(address.sin_port);
}

}  // namespace cohort::comm::testing
