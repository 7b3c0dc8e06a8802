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
#include <unistd.h>

#include <atomic>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/server/daemon_config.h"
#include "daemon/server/daemon_flags.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/journal_logging.h"
#include "daemon/server/systemd_notifier.h"
#include "worker/base/cli_flags.h"
#include "worker/base/logging.h"

namespace {

constexpr const char* kDescription = R"(cohortd runs on every node of a cohort cluster: it owns the node's devices and launches and
supervises training workers; one daemon also acts as coordinator (rendezvous, job placement,
job records).

Secure by default: every port serves TLS only. On first start the coordinator creates a cluster CA
in DATA_DIR/ca and the first admin's credentials in DATA_DIR/admin.credentials (use them with
`cohort --credentials FILE`). An agent on another node joins once with --join-token (an admin
prints one with `cohort node token`) and keeps its node certificate in DATA_DIR/node.

Settings come from the config file (--config), then the flags, which override it.)";

constexpr const char* kFooter = R"(examples:
  cohortd --config /etc/cohort/cohortd.yaml
  cohortd --role coordinator --listen 127.0.0.1:7070 --data-dir /var/lib/cohort
  cohortd --role agent --coordinator 10.0.0.1:7070 --join-token TOKEN --slots 8 --data-dir /var/lib/cohort
  cohortd --role all --listen 127.0.0.1:7070 --slots 2 --data-dir /tmp/cohort

With port 0 the chosen address is printed on stdout as "listening on HOST:PORT".

Under systemd (Type=notify) cohortd reports READY=1 once it listens and pings the watchdog at half
of WatchdogSec. SIGTERM or SIGINT drains: health turns NOT_SERVING, new jobs and launches are
refused (UNAVAILABLE "draining"), running tasks are stopped with the grace period, then the
server shuts down.)";

using cohort::cli_flags::kExitUsage;

int usage_error(const std::string& message) {
  std::fprintf(stderr, "cohortd: %s\nrun 'cohortd --help' for the options\n", message.c_str());
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  auto app = cohort::cli_flags::make_app("cohortd", kDescription);
  app->footer(kFooter);
  cohort::daemon::DaemonFlags flags(*app);
  if (std::optional<int> exit = cohort::cli_flags::parse(*app, argc, argv)) return *exit;
  cohort::daemon::DaemonConfig config;
  if (!flags.config_file().empty()) {
    cohort::Status loaded = config.apply_file(flags.config_file());
    if (!loaded.ok()) {
      std::fprintf(stderr, "cohortd: %s\n", loaded.message().c_str());
      return kExitUsage;
    }
  }
  if (cohort::Status applied = flags.apply(config); !applied.ok()) return usage_error(applied.message());
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

  // A highly available coordinator that loses its leadership stops acting at once and exits 1, so
  // its supervisor (systemd Restart=on-failure) brings it back as a standby (issue 16).
  static std::atomic<bool> lost_leadership{false};
  options->on_leadership_lost = [] {
    lost_leadership = true;
    kill(getpid(), SIGTERM);
  };
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
  return lost_leadership ? 1 : 0;
}
