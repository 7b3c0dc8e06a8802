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
#include <string>
#include <vector>

#include "bench/bench_table.h"

namespace {

constexpr int kDefaultIters = 20;
constexpr int kDefaultWarmup = 3;
constexpr size_t kDefaultBytes = size_t{16} << 20;

constexpr const char* kUsage =
    "usage: memcpy_bandwidth [-s SIZE] [-n ITERS] [-w WARMUP]   (default -s 16M -n 20 -w 3)\n";

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = kDefaultBytes;
  int iters = kDefaultIters, warmup = kDefaultWarmup;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    bool ok = false;
    if (a == "-s")
      ok = cohort::bench::parse_size(v, &bytes) && bytes > 0;
    else if (a == "-n")
      ok = (iters = std::atoi(v.c_str())) > 0;
    else if (a == "-w")
      ok = (warmup = std::atoi(v.c_str())) >= 0;
    if (!ok) {
      std::fprintf(stderr, "memcpy_bandwidth: bad or incomplete argument '%s %s'\n%s", a.c_str(), v.c_str(),
                   kUsage);
      return 2;
    }
    ++i;
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
