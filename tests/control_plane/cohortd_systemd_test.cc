// cohortd as systemd runs it: settings from --config with flags overriding the file, sd_notify
// READY=1 once it listens, WATCHDOG=1 pings at half of WATCHDOG_USEC, STOPPING=1 on SIGTERM and a
// clean exit; a config file with an unknown key is refused naming the file and line. The test
// plays systemd: it binds the NOTIFY_SOCKET datagram socket and reads what cohortd sends.

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/coordinator/temp_dir.h"
#include "daemon/server/systemd_notifier.h"

namespace cohort::daemon {
namespace {

using coordinator::testing::TempDir;

constexpr const char* kCohortd = "daemon/cohortd";  // in the test's runfiles
constexpr int kTimeoutMs = 10000;

// cohortd started with extra environment; stderr captured. Killed if the test did not reap it.
struct Daemon {
  pid_t pid = -1;
  int err_fd = -1;

  ~Daemon() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (err_fd >= 0) close(err_fd);
  }
  int wait_exit() {
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  std::string read_stderr() {
    std::string text;
    char buffer[4096];
    for (ssize_t n; (n = read(err_fd, buffer, sizeof(buffer))) > 0;)
      text.append(buffer, static_cast<size_t>(n));
    return text;
  }
};

void start(const std::vector<std::string>& args, const std::vector<std::string>& env, Daemon* daemon) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  daemon->pid = fork();
  if (daemon->pid == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    for (const std::string& entry : env) putenv(const_cast<char*>(entry.c_str()));
    std::vector<char*> argv = {const_cast<char*>(kCohortd)};
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(kCohortd, argv.data());
    _exit(127);
  }
  close(fds[1]);
  daemon->err_fd = fds[0];
}

// The NOTIFY_SOCKET end: a unix datagram socket bound at `path`.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << std::strerror(errno);
  }
  ~NotifySocket() {
    close(fd_);
    unlink(path_.c_str());
  }
  // The next message, or "" after the timeout.
  std::string next(int timeout_ms = kTimeoutMs) {
    pollfd ready = {fd_, POLLIN, 0};
    if (poll(&ready, 1, timeout_ms) <= 0) return "";
    char buffer[4096];
    const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
  }
  // Messages until one contains `needle` (returned) or the timeout ("").
  std::string until(const std::string& needle) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (std::chrono::steady_clock::now() < give_up) {
      std::string message = next();
      if (message.find(needle) != std::string::npos) return message;
    }
    return "";
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(CohortdSystemdTest, ConfigFileFlagsOverrideNotifyReadyWatchdogStopping) {
  TempDir dir;
  const std::string config = dir.path() + "/cohortd.yaml";
  // The file's listen address cannot be bound; the flag below must win for the daemon to start.
  std::ofstream(config) << "role: coordinator\nlisten: no-such-host.invalid:7070\ndata_dir: " << dir.path()
                        << "/data\nlog_level: warn\n";
  // Under /tmp, not the (long) test directory: a socket path has at most 107 characters.
  const std::string socket_path = "/tmp/cohortd-notify-" + std::to_string(getpid());
  NotifySocket notify(socket_path);
  Daemon daemon;
  start({"--config", config, "--listen", "127.0.0.1:0"},
        {"NOTIFY_SOCKET=" + socket_path, "WATCHDOG_USEC=200000"}, &daemon);
  const std::string ready = notify.until("READY=1");
  ASSERT_NE(ready, "") << "no READY=1 from cohortd; stderr:\n" << daemon.read_stderr();
  EXPECT_NE(ready.find("STATUS=listening on 127.0.0.1:"), std::string::npos) << ready;
  // Pings every 100 ms (half of 200 ms): two arrive well within the timeout.
  EXPECT_NE(notify.until("WATCHDOG=1"), "");
  EXPECT_NE(notify.until("WATCHDOG=1"), "");
  ASSERT_EQ(kill(daemon.pid, SIGTERM), 0);
  EXPECT_NE(notify.until("STOPPING=1"), "");
  EXPECT_EQ(daemon.wait_exit(), 0);
}

// The watchdog pings only while the daemon says it is healthy: a daemon whose loops are stuck
// stops pinging and systemd restarts it.
TEST(CohortdSystemdTest, WatchdogPingsOnlyWhileHealthy) {
  const std::string socket_path = "/tmp/cohortd-notify-health-" + std::to_string(getpid());
  NotifySocket notify(socket_path);
  setenv("NOTIFY_SOCKET", socket_path.c_str(), 1);
  setenv("WATCHDOG_USEC", "100000", 1);  // a ping every 50 ms
  unsetenv("WATCHDOG_PID");
  std::atomic<bool> healthy{false};
  {
    SystemdNotifier systemd;
    systemd.start_watchdog([&healthy] { return healthy.load(); });
    // Six ping periods without a ping while unhealthy.
    EXPECT_EQ(notify.next(/*timeout_ms=*/300), "");
    healthy = true;
    EXPECT_NE(notify.until("WATCHDOG=1"), "");
  }
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
}

TEST(CohortdSystemdTest, UnknownConfigKeyIsRefusedNamingFileAndLine) {
  TempDir dir;
  const std::string config = dir.path() + "/bad.yaml";
  std::ofstream(config) << "role: all\nslot: 4\ndata_dir: /tmp\n";
  Daemon daemon;
  start({"--config", config}, {}, &daemon);
  EXPECT_EQ(daemon.wait_exit(), 2);
  const std::string err = daemon.read_stderr();
  EXPECT_NE(err.find(config + ":2: unknown key 'slot'"), std::string::npos) << err;
}

}  // namespace
}  // namespace cohort::daemon
