// memcpy_bandwidth: one core's memcpy of a buffer, the yardstick for bus bandwidth on one node.
// bench/compare_mpi.sh runs it in the same run as cohort-bench and its MPI peer, so "busbw vs
// memcpy" compares numbers taken under the same load.
//
//   memcpy_bandwidth -s 16M -n 20
//
// Prints one line: "memcpy <bytes> B: <time> us, <GB/s> GB/s" where GB/s is bytes copied per
// second (each byte is read once and written once, so memory traffic is twice that). Both buffers
// are touched first, so page faults are not timed; the time is the average of -n copies after -w
// untimed ones.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_table.h"
#include "worker/base/cli_flags.h"

namespace {

constexpr int kDefaultIters = 20;
constexpr int kDefaultWarmup = 3;
constexpr size_t kDefaultBytes = size_t{16} << 20;

constexpr const char* kDescription =
    "One core's memcpy of a buffer: the yardstick bench/compare_mpi.sh sets bus bandwidth against. Prints\n"
    "\"memcpy <bytes> B: <time> us, <GB/s> GB/s\", the average of ITERS copies after WARMUP untimed ones.";

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = kDefaultBytes;
  int iters = kDefaultIters, warmup = kDefaultWarmup;
  // The one flag library (worker/base/cli_flags.h): cohort's --help, --version and usage errors.
  auto app = cohort::cli_flags::make_app("memcpy_bandwidth", kDescription);
  std::string size = "16M";
  app->add_option("-s", size, "bytes to copy, e.g. 4096, 64K, 16M")->type_name("SIZE")->capture_default_str();
  app->add_option("-n", iters, "timed copies")->type_name("ITERS")->check(CLI::PositiveNumber)->capture_default_str();
  app->add_option("-w", warmup, "untimed copies first")
      ->type_name("WARMUP")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  if (std::optional<int> exit = cohort::cli_flags::parse(*app, argc, argv)) return *exit;
  if (!cohort::bench::parse_size(size, &bytes) || bytes == 0) {
    std::fprintf(stderr,
                 "memcpy_bandwidth: -s '%s' is not a positive size such as 4096, 64K, 16M\n"
                 "run 'memcpy_bandwidth --help' for the options\n",
                 size.c_str());
    return cohort::cli_flags::kExitUsage;
  }
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  for (int w = 0; w < warmup; ++w) std::memcpy(dst.data(), src.data(), bytes);
  auto start = std::chrono::steady_clock::now();
  for (int it = 0; it < iters; ++it) {
    // Vary one byte so the copies cannot be merged or elided.
    src[static_cast<size_t>(it) % bytes] = static_cast<char>(it);
    std::memcpy(dst.data(), src.data(), bytes);
  }
  double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / iters;
  if (dst[static_cast<size_t>(iters - 1) % bytes] != static_cast<char>(iters - 1)) {
    std::fprintf(stderr, "memcpy_bandwidth: the copy did not arrive\n");
    return 1;
  }
  std::printf("memcpy %zu B: %.2f us, %.2f GB/s\n", bytes, us, bytes / (us * 1e3));
  return 0;
}
