// cohortd: the cohort node daemon (coordinator, agent, or both).
//
//   cohortd --version
//   cohortd --role all --listen 127.0.0.1:7070 --data-dir /var/lib/cohort
//
// main only parses flags; the daemon's logic lives in daemon/coordinator and daemon/agent.

#include <cstdio>
#include <cstring>
#include <string>

#include "worker/base/logging.h"
#include "worker/base/version.h"

namespace {

constexpr const char* kUsage = R"(usage: cohortd [--version] [--help]

cohortd runs on every node of a cohort cluster: it owns the node's devices and launches and
supervises training workers; one daemon also acts as coordinator (rendezvous, job placement,
job records).

  --version   print the version and exit
  --help      print this help and exit
)";

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("cohortd %s\n", cohort::kVersion);
      return 0;
    }
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "cohortd: unknown argument '%s'\n\n%s", argv[i], kUsage);
    return 2;
  }
  cohort::init_logging("cohortd");
  spdlog::error("cohortd: no role given yet; see --help");
  return 2;
}
