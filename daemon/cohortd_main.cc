// cohortd: the cohort node daemon (coordinator, agent, or both).
//
//   cohortd --version
//   cohortd --config /etc/cohort/cohortd.yaml                  # settings from a file
//   cohortd --config cohortd.yaml --slots 4                    # flags override the file
//   cohortd --role coordinator --listen 127.0.0.1:7070 --data-dir /var/lib/cohort
//   cohortd --role agent --listen 10.0.0.2:7071 --coordinator 10.0.0.1:7070 --slots 8
//           --data-dir /var/lib/cohort
//   cohortd --role all --listen 127.0.0.1:7070 --slots 2 --data-dir /tmp/cohort
//
// main only parses flags; the daemon's logic lives in daemon/coordinator, daemon/service and
// daemon/server.

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "daemon/server/daemon_config.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/journal_logging.h"
#include "daemon/server/systemd_notifier.h"
#include "worker/base/logging.h"
#include "worker/base/version.h"

namespace {

constexpr const char* kUsageHead = R"(usage: cohortd --config FILE [flags]
       cohortd --role coordinator [--listen HOST:PORT] --data-dir DIR
       cohortd --role agent --coordinator HOST:PORT --join-token TOKEN [--listen HOST:PORT] [--slots N]
               --data-dir DIR
       cohortd --role all [--listen HOST:PORT] [--slots N] --data-dir DIR
       cohortd --version | --help

cohortd runs on every node of a cohort cluster: it owns the node's devices and launches and
supervises training workers; one daemon also acts as coordinator (rendezvous, job placement,
job records).

Secure by default: every port serves TLS only. On first start the coordinator creates a cluster CA
in DATA_DIR/ca and the first admin's credentials in DATA_DIR/admin.credentials (use them with
`cohort --credentials FILE`). An agent on another node joins once with --join-token (an admin
prints one with `cohort node token`) and keeps its node certificate in DATA_DIR/node.

  --config FILE      read settings from a YAML file (configs/cohortd.yaml lists every key);
                     flags given as well override the file
)";

constexpr const char* kUsageTail = R"(  --version          print the version and exit
  --help             print this help and exit

Flags take their value as the next argument or after '=' (--listen=127.0.0.1:0). With port 0
the chosen address is printed on stdout as "listening on HOST:PORT".

Under systemd (Type=notify) cohortd reports READY=1 once it listens and pings the watchdog at half
of WatchdogSec. SIGTERM or SIGINT drains: health turns NOT_SERVING, new jobs and launches are
refused (UNAVAILABLE "draining"), running tasks are stopped with the grace period, then the
server shuts down.
)";

// Exit status for a command line that cannot be run (as getopt-based tools use).
constexpr int kUsageError = 2;

std::string usage() {
  std::string text = kUsageHead;
  for (const cohort::daemon::DaemonSetting& setting : cohort::daemon::daemon_settings()) {
    const std::string flag = fmt::format("{} {}", setting.flag, setting.value_name);
    // Too long for the column: the help goes on the next line, indented to the column.
    text += flag.size() > 18 ? fmt::format("  {}\n  {:<18} {}\n", flag, "", setting.help)
                             : fmt::format("  {:<18} {}\n", flag, setting.help);
  }
  return text + kUsageTail;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "cohortd: %s\n\n%s", message.c_str(), usage().c_str());
  return kUsageError;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_file;
  std::vector<std::pair<std::string, std::string>> flags;  // applied after the file, in order
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--version") {
      std::printf("cohortd %s\n", cohort::kVersion);
      return 0;
    }
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage().c_str(), stdout);
      return 0;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    if (name != "--config" && !cohort::daemon::DaemonConfig::is_setting_flag(name))
      return usage_error("unknown argument '" + arg + "'");
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return usage_error(name + " needs a value");
    }
    if (name == "--config") {
      config_file = value;
    } else {
      flags.emplace_back(name, value);
    }
  }
  cohort::daemon::DaemonConfig config;
  if (!config_file.empty()) {
    cohort::Status loaded = config.apply_file(config_file);
    if (!loaded.ok()) {
      std::fprintf(stderr, "cohortd: %s\n", loaded.message().c_str());
      return kUsageError;
    }
  }
  for (const auto& [flag, value] : flags) {
    cohort::Status applied = config.apply_flag(flag, value);
    if (!applied.ok()) return usage_error(applied.message());
  }
  auto options = config.options();
  if (!options.ok()) return usage_error(options.status().message());
  // COHORT_LOG_LEVEL is how every cohort binary takes its level; the config's log_level sets it.
  if (!config.log_level().empty()) setenv("COHORT_LOG_LEVEL", config.log_level().c_str(), 1);

  if (cohort::Status logging = cohort::init_logging("cohortd"); !logging.ok()) {
    return usage_error(logging.message() + " (cohortd's log_level setting sets COHORT_LOG_LEVEL)");
  }
  // Under systemd, records go to journald with their priority (journalctl -p err).
  cohort::daemon::log_to_journal_if_attached("cohortd");
  // Block the stop signals before any thread starts, so every thread inherits the mask and
  // sigwait below is the only place they arrive.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  cohort::daemon::SystemdNotifier systemd;
  auto server = cohort::daemon::DaemonServer::start(*options);
  if (!server.ok()) {
    std::fprintf(stderr, "cohortd: %s\n", server.status().to_string().c_str());
    return 1;
  }
  std::printf("listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);
  cohort::Status ready = systemd.notify_ready("listening on " + (*server)->address());
  if (!ready.ok()) spdlog::warn("cohortd: {}", ready.to_string());
  // Pings only while the daemon's tick / agent loops make progress: a stuck loop gets a restart.
  cohort::daemon::DaemonServer* daemon = (*server).get();
  systemd.start_watchdog([daemon] { return daemon->healthy(); });

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("cohortd: {} received, draining", strsignal(signal_number));
  cohort::Status stopping = systemd.notify_stopping("draining");
  if (!stopping.ok()) spdlog::warn("cohortd: {}", stopping.to_string());
  (*server)->drain();
  (*server)->shutdown();
  systemd.stop_watchdog();  // its health check reads the server, which goes before the notifier
  return 0;
}
