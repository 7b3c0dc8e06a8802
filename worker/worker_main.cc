// cohort-worker: one training process of a cohort job.
//
//   cohort-worker --version
//
// main only parses flags; training lives in worker/train, communication in worker/comm.

#include <cstdio>
#include <cstring>

#include "worker/worker_info.h"

namespace {

constexpr const char* kUsage = R"(usage: cohort-worker [--version] [--help]

cohort-worker is one training process (one rank) of a cohort job. cohortd's agent starts it;
any other launcher (mpirun, srun, a shell loop) can start it with --init env://.

  --version   print the version and what it was built against, and exit
  --help      print this help and exit
)";

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s\n", cohort::worker::version_string().c_str());
      return 0;
    }
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::fprintf(stderr, "cohort-worker: unknown argument '%s'\n\n%s", argv[i], kUsage);
    return 2;
  }
  std::fputs(kUsage, stderr);
  return 2;
}
