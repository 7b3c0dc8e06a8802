// cohort: the command-line client of a cohort cluster.
//
//   cohort --version
//   cohort version --coordinator 127.0.0.1:7070
//
// main only parses flags; requests are made through client/client.h.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "client/client.h"
#include "worker/base/version.h"

namespace {

constexpr const char* kUsage = R"(usage: cohort [--version] [--help] <command> [args]

cohort submits data-parallel jobs and model-parallel graphs to a cohort cluster and watches them.

commands:
  version [--coordinator HOST:PORT]   print this client's and the daemon's versions

options:
  --coordinator HOST:PORT   the coordinator to talk to (default: $COHORT_COORDINATOR, else 127.0.0.1:7070)
  --version                 print the client version and exit
  --help                    print this help and exit
)";

}  // namespace

int main(int argc, char** argv) {
  std::string command;
  std::string coordinator = cohort::client::default_coordinator_address();
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (std::strcmp(arg, "--version") == 0) {
      std::printf("cohort %s\n", cohort::kVersion);
      return 0;
    }
    if (std::strcmp(arg, "--help") == 0 || std::strcmp(arg, "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (std::strcmp(arg, "--coordinator") == 0 && i + 1 < argc) {
      coordinator = argv[++i];
      continue;
    }
    if (command.empty() && arg[0] != '-') {
      command = arg;
      continue;
    }
    std::fprintf(stderr, "cohort: unknown argument '%s'\n\n%s", arg, kUsage);
    return 2;
  }
  if (command == "version") {
    std::printf("cohort %s\n", cohort::kVersion);
    cohort::client::Client client(coordinator);
    auto info = client.server_version();
    if (!info.ok()) {
      std::fprintf(stderr, "cohort: %s\n", info.status().message().c_str());
      return 1;
    }
    std::printf("%s %s at %s\n", info->component().c_str(), info->version().c_str(), coordinator.c_str());
    return 0;
  }
  std::fprintf(stderr, "cohort: %s\n\n%s", command.empty() ? "no command given" : ("unknown command '" + command + "'").c_str(), kUsage);
  return 2;
}
