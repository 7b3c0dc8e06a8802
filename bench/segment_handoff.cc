// segment_handoff: what it costs one process to hand a message to another through shared memory,
// and why the shared-memory engine's posts move through their slot (worker/comm/shm, post_area).
//
//   segment_handoff -s 1M --piece 256K --ring 512K     # two alternating regions, as the engine was
//   segment_handoff -s 1M --piece 256K --ring 4M       # moving through 4 MiB, as it is now
//
// A writer process copies each message into a shared mapping in pieces, at offset
// (piece number * piece) mod RING, and bumps a flag; a reader process waits for the flag, copies the
// piece out and acknowledges it; the writer may run two pieces ahead (the engine's two banks). So
// with a ring of two pieces the writer always writes lines the reader has just read, and must take
// them out of the reader's cache first. Prints one line:
//   "handoff <bytes> B in <piece> B pieces through <ring> B: <us> us per message, writer copy <us> us,
//    reader copy <us> us"
// The writer is on CPU 1 and the reader on CPU 0 (--no-pin: wherever the scheduler puts them).

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_table.h"
#include "worker/base/cli_flags.h"

namespace {

constexpr const char* kDescription =
    "Two processes hand messages over through a shared mapping: the writer copies each piece in at\n"
    "offset (piece number * PIECE) mod RING, the reader copies it out. With RING = 2 pieces the\n"
    "writer writes lines the reader has just read. Prints the time per message and each side's copy\n"
    "time (bench/README.md: the shared-memory engine's rotating posts).";

using Clock = std::chrono::steady_clock;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

// The flags, on their own cache lines, after the ring.
struct Flags {
  alignas(128) std::atomic<uint64_t> posted{0};
  alignas(128) std::atomic<uint64_t> taken{0};
  alignas(128) double writer_us = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string size = "1M", piece_text = "256K", ring_text = "4M";
  int iters = 2000;
  bool no_pin = false;
  auto app = cohort::cli_flags::make_app("segment_handoff", kDescription);
  app->add_option("-s", size, "message bytes, e.g. 32K, 1M")->type_name("SIZE")->capture_default_str();
  app->add_option("--piece", piece_text, "bytes per piece (at most SIZE)")->type_name("SIZE")->capture_default_str();
  app->add_option("--ring", ring_text, "bytes the writer's offsets move through (at least 2 pieces)")
      ->type_name("SIZE")
      ->capture_default_str();
  app->add_option("-n", iters, "timed messages")->type_name("ITERS")->check(CLI::PositiveNumber)->capture_default_str();
  app->add_flag("--no-pin", no_pin, "leave both processes to the scheduler instead of CPUs 1 and 0");
  if (std::optional<int> exit = cohort::cli_flags::parse(*app, argc, argv)) return *exit;
  size_t bytes = 0, piece = 0, ring = 0;
  if (!cohort::bench::parse_size(size, &bytes) || !cohort::bench::parse_size(piece_text, &piece) ||
      !cohort::bench::parse_size(ring_text, &ring) || bytes == 0 || piece == 0 || piece > bytes ||
      ring < 2 * piece) {
    std::fprintf(stderr,
                 "segment_handoff: need sizes with 0 < --piece <= -s and --ring >= 2 x --piece (got -s %s --piece %s "
                 "--ring %s)\nrun 'segment_handoff --help' for the options\n",
                 size.c_str(), piece_text.c_str(), ring_text.c_str());
    return cohort::cli_flags::kExitUsage;
  }
  const size_t pieces = (bytes + piece - 1) / piece;
  void* mapped = mmap(nullptr, ring + sizeof(Flags), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE,
                      -1, 0);
  if (mapped == MAP_FAILED) {
    std::perror("segment_handoff: mmap");
    return 1;
  }
  auto* shared = static_cast<uint8_t*>(mapped);
  auto* flags = new (shared + ring) Flags;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  const int warmup = 20;
  const uint64_t total = static_cast<uint64_t>(warmup + iters) * pieces;
  auto place = [&](uint64_t g) { return shared + (g * piece) % (ring - ring % piece); };
  auto length = [&](uint64_t g) { return std::min(piece, bytes - ((g - 1) % pieces) * piece); };
  const pid_t writer = fork();
  if (writer < 0) {
    std::perror("segment_handoff: fork");
    return 1;
  }
  if (writer == 0) {
    if (!no_pin) pin(1);
    Clock::duration copying{};
    for (uint64_t g = 1; g <= total; ++g) {
      while (flags->taken.load(std::memory_order_acquire) + 2 < g) {
      }
      src[(g * 64) % bytes] = static_cast<uint8_t>(g);  // no two messages alike
      const auto start = Clock::now();
      std::memcpy(place(g), src.data() + ((g - 1) % pieces) * piece, length(g));
      if (g > static_cast<uint64_t>(warmup) * pieces) copying += Clock::now() - start;
      flags->posted.store(g, std::memory_order_release);
    }
    flags->writer_us = micros(copying) / iters;
    _exit(0);
  }
  if (!no_pin) pin(0);
  Clock::duration copying{};
  Clock::time_point began;
  for (uint64_t g = 1; g <= total; ++g) {
    if (g == static_cast<uint64_t>(warmup) * pieces + 1) began = Clock::now();
    while (flags->posted.load(std::memory_order_acquire) < g) {
    }
    const auto start = Clock::now();
    std::memcpy(dst.data() + ((g - 1) % pieces) * piece, place(g), length(g));
    if (g > static_cast<uint64_t>(warmup) * pieces) copying += Clock::now() - start;
    flags->taken.store(g, std::memory_order_release);
  }
  const double per_message = micros(Clock::now() - began) / iters;
  int status = 0;
  waitpid(writer, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "segment_handoff: the writer process failed\n");
    return 1;
  }
  std::printf("handoff %zu B in %zu B pieces through %zu B: %.2f us per message, writer copy %.2f us, reader copy "
              "%.2f us\n",
              bytes, piece, ring, per_message, flags->writer_us, micros(copying) / iters);
  return 0;
}
