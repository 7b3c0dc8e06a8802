// cohortd: the cohort node daemon (coordinator, agent, or both).
//
//   cohortd --version
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

#include "daemon/server/daemon_server.h"
#include "worker/base/logging.h"
#include "worker/base/version.h"

namespace {

constexpr const char* kUsage = R"(usage: cohortd --role coordinator [--listen HOST:PORT] --data-dir DIR
       cohortd --role agent --coordinator HOST:PORT [--listen HOST:PORT] [--slots N] --data-dir DIR
       cohortd --role all [--listen HOST:PORT] [--slots N] --data-dir DIR
       cohortd --version | --help

cohortd runs on every node of a cohort cluster: it owns the node's devices and launches and
supervises training workers; one daemon also acts as coordinator (rendezvous, job placement,
job records).

  --role ROLE        coordinator, agent (runs this node's workers), or all (both)
  --listen HOST:PORT where to serve gRPC (default 127.0.0.1:7070; port 0 picks a free port,
                     printed on stdout as "listening on HOST:PORT")
  --data-dir DIR     the coordinator's job database; the agent's rank logs under DIR/logs
                     (required)
  --coordinator HOST:PORT  the coordinator an agent registers with (required for agent;
                     all registers with itself)
  --slots N          worker processes this node runs at once (agent, all; default 1)
  --node-id ID       the node's id in the cluster (agent, all; default: the host name)
  --log-dir DIR      where rank logs go (agent, all; default DATA_DIR/logs)
  --worker PATH      the worker binary each task runs (agent, all; default
                     /usr/local/bin/cohort-worker)
  --version          print the version and exit
  --help             print this help and exit

Flags take their value as the next argument or after '=' (--listen=127.0.0.1:0).
SIGINT or SIGTERM drains and stops the daemon.
)";

// Exit status for a command line that cannot be run (as getopt-based tools use).
constexpr int kUsageError = 2;

struct Flags {
  std::string role;
  std::string listen = cohort::daemon::kDefaultListenAddress;
  std::string data_dir;
  std::string coordinator;
  std::string slots = "1";
  std::string node_id;
  std::string log_dir;
  std::string worker = cohort::daemon::kDefaultWorkerPath;
};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "cohortd: %s\n\n%s", message.c_str(), kUsage);
  return kUsageError;
}

// Takes the value of flag `name` at argv[*i] ("--name value" or "--name=value"); false when
// argv[*i] is not that flag. A missing value is reported through `error`.
bool take_value(const char* name, int argc, char** argv, int* i, std::string* value, std::string* error) {
  const size_t length = std::strlen(name);
  const char* arg = argv[*i];
  if (std::strncmp(arg, name, length) != 0) return false;
  if (arg[length] == '=') {
    *value = arg + length + 1;
    return true;
  }
  if (arg[length] != '\0') return false;
  if (*i + 1 >= argc) {
    *error = std::string(name) + " needs a value";
    return true;
  }
  *value = argv[++*i];
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("cohortd %s\n", cohort::kVersion);
      return 0;
    }
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::string error;
    if (take_value("--role", argc, argv, &i, &flags.role, &error) ||
        take_value("--listen", argc, argv, &i, &flags.listen, &error) ||
        take_value("--data-dir", argc, argv, &i, &flags.data_dir, &error) ||
        take_value("--coordinator", argc, argv, &i, &flags.coordinator, &error) ||
        take_value("--slots", argc, argv, &i, &flags.slots, &error) ||
        take_value("--node-id", argc, argv, &i, &flags.node_id, &error) ||
        take_value("--log-dir", argc, argv, &i, &flags.log_dir, &error) ||
        take_value("--worker", argc, argv, &i, &flags.worker, &error)) {
      if (!error.empty()) return usage_error(error);
      continue;
    }
    return usage_error(std::string("unknown argument '") + argv[i] + "'");
  }
  if (flags.role.empty()) return usage_error("no --role given");
  auto role = cohort::daemon::parse_daemon_role(flags.role);
  if (!role.ok()) return usage_error("unknown --role '" + flags.role + "'");
  if (flags.data_dir.empty()) return usage_error("--data-dir is required for --role " + flags.role);
  if (*role == cohort::daemon::DaemonRole::kAgent && flags.coordinator.empty())
    return usage_error("--coordinator HOST:PORT is required for --role agent");
  char* slots_end = nullptr;
  const long slots = std::strtol(flags.slots.c_str(), &slots_end, 10);
  if (flags.slots.empty() || *slots_end != '\0' || slots < 1 || slots > 4096)
    return usage_error("--slots '" + flags.slots + "' is not a number of worker slots (1..4096)");

  cohort::init_logging("cohortd");
  // Block the stop signals before any thread starts, so every thread inherits the mask and
  // sigwait below is the only place they arrive.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  cohort::daemon::DaemonServerOptions options;
  options.listen = flags.listen;
  options.data_dir = flags.data_dir;
  options.role = *role;
  options.coordinator_address = flags.coordinator;
  options.slots = static_cast<int>(slots);
  options.node_id = flags.node_id;
  options.log_dir = flags.log_dir;
  options.worker_command = {flags.worker};
  auto server = cohort::daemon::DaemonServer::start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "cohortd: %s\n", server.status().to_string().c_str());
    return 1;
  }
  std::printf("listening on %s\n", (*server)->address().c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("cohortd: {} received, draining", strsignal(signal_number));
  (*server)->shutdown();
  return 0;
}
