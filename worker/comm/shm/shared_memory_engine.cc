#include "worker/comm/shm/shared_memory_engine.h"

#include <fcntl.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <mutex>
#include <random>

#include <spdlog/spdlog.h>

#include "worker/base/process_liveness.h"
#include "worker/comm/algorithms/collectives.h"
#include "worker/comm/reduce/reduce_kernels.h"

namespace cohort::comm {

// One rank's flags, on its own cache lines (two, against the adjacent-line prefetcher) so a
// rank bumping its generation does not disturb the lines its peers spin on.
struct alignas(128) SharedMemoryEngine::Control {
  std::atomic<uint32_t> arrive;   // barriers passed: the generation, and the futex word
  std::atomic<uint32_t> waiters;  // peers inside FUTEX_WAIT on `arrive` (the waker skips the syscall at 0)
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> oversubscribed;  // setup: rank 0's verdict is every rank's (broadcast_piece)
  std::atomic<uint64_t> start_time;  // /proc/<pid>/stat field 22: tells a reused pid apart
  std::atomic<int32_t> cpu;          // the CPU this rank last published from (wait_for's co-location test)
  std::atomic<uint32_t> single_copy_ok;  // setup: 1 once this rank has read every peer's probe (see below)
  // Tiny messages (at most kShmInlineBytes per rank, both banks) travel in the flag's own cache
  // line: a peer that sees the new generation already holds the data, one line transfer instead
  // of two (the flag's, then the slot's). Ordered by `arrive`'s release / acquire, as the slots.
  alignas(32) uint8_t inline_data[2][kShmInlineBytes];
  // Single copy, on the second line (written once per operation, read by every peer). `exposed_*`:
  // this rank's buffer for the phase it ends next, valid from that `arrive` until every reader
  // has ended the phase after (see "Single copy" in the header).
  alignas(64) std::atomic<uint64_t> exposed_address;
  std::atomic<uint64_t> exposed_bytes;
  std::atomic<uint64_t> probe_address;  // setup: where this rank's probe word is (0: CMA off here)
  std::atomic<uint64_t> probe_value;    // setup: the value peers must read there
  std::atomic<uint64_t> windows[4];     // setup: this rank's broadcast min, max, allgather min, max
};

namespace {

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain 32-bit words");
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex words must be plain 32-bit words");

std::atomic<uint64_t> g_single_copy_operations{0};

// PR_SET_PTRACER_ANY lets any process of this user read this one's memory under Yama's
// ptrace_scope 1. Set once and kept for the life of the process, as UCX's CMA transport (which
// sets it itself at startup) and OpenMPI's vader do: the setting is process-wide, so giving it
// back when an engine stops also took it from UCX, whose peers' rendezvous reads of this
// process then failed with EPERM (review, 2026-11-24).
void allow_sibling_readers() {
  // Per process, not once: a child forked after its parent set it does not inherit Yama's exception.
  // No lock (a fork could copy it held); two threads setting it at once set the same value.
  static std::atomic<pid_t> set_in{0};
  const pid_t self = getpid();
  if (set_in.load(std::memory_order_acquire) == self) return;
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  set_in.store(self, std::memory_order_release);
}

// The control blocks fill the first pages; the slots start page-aligned after them.
constexpr size_t kControlBytes = 128;
constexpr size_t kDataOffset = kControlBytes * kShmMaxRanks;
// Two banks, each an input and a result region of one chunk.
constexpr size_t kSlotBytes = 4 * kShmChunkBytes;
// Each rank's broadcast ring (after the slots): kShmRingEntries entries of a cache line each, the
// data and, after it, the tag: the phase count (phases_, 64 bits: it never wraps, and a zeroed
// entry's 0 is never a phase that a broadcast ends) of the broadcast that posted it (ring_tag).
// So a reader polls one line, the entry's, and finds the data in it: one line transfer per tiny
// broadcast instead of two (the root's flag, then the entry), and the root's next entries are not
// on the line the reader is reading.
constexpr size_t kRingEntryBytes = 64;
// Where the tag sits in an entry: after the data, 8-byte aligned.
constexpr size_t kRingTagOffset = 32;
static_assert(kShmInlineBytes <= kRingTagOffset && kRingTagOffset % 8 == 0 &&
                  kRingTagOffset + sizeof(uint64_t) <= kRingEntryBytes,
              "a ring entry holds the data and its tag");
// How often a reader of a tiny broadcast looks at the entry's tag before waiting on the root's flag
// (whose wait polls, yields and sleeps in the futex): a root that runs ahead, the usual case, has
// posted already, and one that is 32 looks (about a microsecond) behind is worth the full wait.
constexpr int kRingTagPolls = 32;
constexpr size_t kRingBytes = kShmRingEntries * kRingEntryBytes;
static_assert((kShmRingEntries & (kShmRingEntries - 1)) == 0, "ring entries index by generation modulo a power of two");
// The segment name travels over the transport in a fixed buffer.
constexpr size_t kNameBytes = 64;
// Each rank's verdict on its environment's settings travels in a fixed buffer (an error longer than
// it is cut, with "...": the variable and its value come first).
constexpr size_t kVerdictBytes = 512;
// The wait policy (wait_for): poll for kPurePollTime, then poll with sched_yield between polls
// until kSpinTime, then sleep in the futex. Measured on the loaded 2-core box (bench/README.md,
// 2-rank allgather, COHORT_SHM_POLL_US / COHORT_SHM_SPIN_US): with the earlier 50 us pure poll
// then futex, 8 B took 57-161 us in 2 of 3 runs (the ranks fell into sleeping and waking each
// other on one core); 200 us then yields to 5 ms took 0.39-0.40 us in all 3, OpenMPI 0.29-0.74.
// The futex still bounds a stopped or slow peer's cost to one spin per wait.
constexpr auto kPurePollTime = std::chrono::microseconds(200);
constexpr auto kSpinTime = std::chrono::milliseconds(5);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

uint32_t* futex_word(std::atomic<uint32_t>& word) { return reinterpret_cast<uint32_t*>(&word); }

// Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, Duration timeout) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000) * 1000000);
  syscall(SYS_futex, futex_word(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// Block `r` of `n` items split over `size` as evenly as possible: [begin, end).
std::pair<size_t, size_t> share(size_t n, int size, int r) {
  size_t base = n / static_cast<size_t>(size), extra = n % static_cast<size_t>(size);
  size_t begin = base * static_cast<size_t>(r) + std::min<size_t>(static_cast<size_t>(r), extra);
  return {begin, begin + base + (static_cast<size_t>(r) < extra ? 1 : 0)};
}

std::vector<size_t> displacements(const std::vector<size_t>& lengths) {
  std::vector<size_t> out(lengths.size(), 0);
  for (size_t i = 1; i < lengths.size(); ++i) out[i] = out[i - 1] + lengths[i - 1];
  return out;
}

size_t chunks_of(size_t bytes) { return (bytes + kShmChunkBytes - 1) / kShmChunkBytes; }

// memcpy, or with `streaming` (a destination too large to stay cached: kShmStreamingStoreBytes)
// through non-temporal stores that skip reading the destination lines first.
void copy_out(void* dst, const void* src, size_t n, bool streaming) {
#if defined(__SSE2__)
  if (streaming && n >= 4096) {
    auto* d = static_cast<uint8_t*>(dst);
    auto* s = static_cast<const uint8_t*>(src);
    size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;  // streaming stores need 16-byte alignment
    std::memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; d += 64, s += 64, n -= 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
    }
    std::memcpy(d, s, n);
    _mm_sfence();  // order the weakly-ordered stores before anything this rank publishes next
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// One read of `src`, two writes: an ordinary copy into `slot` (the segment, read by the peers
// next, so it should stay cached) and a streaming copy into `out` (a large result). Reading the
// source once instead of twice took a 2-rank allgather of 16 MiB from 1.58-1.61 ms to 1.32-1.36 ms
// on the 2-core EPYC (bench/README.md, 2026-11-24 07:26).
void copy_in_and_stream_out(uint8_t* slot, uint8_t* out, const uint8_t* src, size_t n) {
#if defined(__SSE2__)
  if (n >= 4096) {
    size_t head = (16 - (reinterpret_cast<uintptr_t>(out) & 15)) & 15;  // streaming stores need 16-byte alignment
    std::memcpy(slot, src, head);
    std::memcpy(out, src, head);
    slot += head, out += head, src += head, n -= head;
    for (; n >= 64; slot += 64, out += 64, src += 64, n -= 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot), a);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + 16), b);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + 32), c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(slot + 48), e);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 48), e);
    }
    std::memcpy(slot, src, n);
    std::memcpy(out, src, n);
    _mm_sfence();  // as copy_out: the streaming stores are ordered before this rank's next flag
    return;
  }
#endif
  std::memcpy(slot, src, n);
  std::memcpy(out, src, n);
}

}  // namespace

StatusOr<std::unique_ptr<SharedMemoryEngine>> SharedMemoryEngine::create(int rank, int size,
                                                                         const std::string& label,
                                                                         const TransportCollective& transport,
                                                                         Deadline deadline) {
  if (size < 2 || size > kShmMaxRanks) {
    return invalid_argument_error("shared-memory engine for {}: {} ranks (supported: 2..{}, kShmMaxRanks)",
                                  label, size, kShmMaxRanks);
  }
  // The settings from this rank's environment. A malformed one is reported only after the
  // settings exchange below, in which every rank takes part: ranks may see different
  // environments (a per-rank launcher variable, a typo on one node), and a rank that returned
  // here would leave its peers waiting out the whole setup timeout for a segment name.
  std::chrono::microseconds spin_time = kSpinTime, poll_time = kPurePollTime;
  bool single_copy = true, forced_single_copy = false;
  SingleCopyWindow broadcast_window, allgather_window;  // empty: single copy is opt-in (see the header)
  const Status settings = [&]() -> Status {
    // The wait policy's two times, overridable for measuring it on a given machine (bench/README.md).
    for (auto [name, value] :
         {std::pair{"COHORT_SHM_SPIN_US", &spin_time}, std::pair{"COHORT_SHM_POLL_US", &poll_time}}) {
      const char* text = std::getenv(name);
      if (text == nullptr || *text == '\0') continue;
      char* end = nullptr;
      long us = std::strtol(text, &end, 10);
      if (*end != '\0' || us < 0 || us > 1000000) {
        return invalid_argument_error("{}='{}' is not a number of microseconds in 0..1000000", name, text);
      }
      *value = std::chrono::microseconds(us);
    }
    // Single copy (see the header): COHORT_SHM_CMA=0 turns it off on this rank (and so on all); the
    // windows are rank 0's (one rank's settings, so no rank mixes protocols).
    if (const char* text = std::getenv("COHORT_SHM_CMA"); text != nullptr && *text != '\0') {
      if (std::strcmp(text, "0") == 0) {
        single_copy = false;
      } else if (std::strcmp(text, "1") == 0) {
        forced_single_copy = true;
      } else {
        return invalid_argument_error(
            "COHORT_SHM_CMA='{}' is not 0 (every byte through the segment, two copies) or 1 (single copy with "
            "process_vm_readv where every rank can, with any number of ranks); unset: single copy only for 2 "
            "ranks on at least 2 CPUs. Either way only inside the windows COHORT_SHM_CMA_BROADCAST_BYTES / "
            "COHORT_SHM_CMA_ALLGATHER_BYTES open (none by default)", text);
      }
    }
    for (auto [name, window] : {std::pair{"COHORT_SHM_CMA_BROADCAST_BYTES", &broadcast_window},
                                std::pair{"COHORT_SHM_CMA_ALLGATHER_BYTES", &allgather_window}}) {
      const char* text = std::getenv(name);
      if (text == nullptr || *text == '\0') continue;
      if (std::strcmp(text, "off") == 0) {
        *window = SingleCopyWindow{};
        continue;
      }
      // MIN or MIN:MAX, whole-message bytes.
      char* end = nullptr;
      errno = 0;
      unsigned long long min = std::strtoull(text, &end, 10), max = SIZE_MAX;
      bool valid = end != text && errno == 0 && text[0] != '-';
      if (valid && *end == ':') {
        const char* rest = end + 1;
        max = std::strtoull(rest, &end, 10);
        valid = end != rest && errno == 0 && rest[0] != '-' && min <= max;
      }
      if (!valid || *end != '\0') {
        return invalid_argument_error(
            "{}='{}' is not MIN, MIN:MAX (message bytes, MIN <= MAX) or off; see worker/README.md", name, text);
      }
      *window = SingleCopyWindow{static_cast<size_t>(min), static_cast<size_t>(max)};
    }
    return ok_status();
  }();
  // Every rank states its verdict on its settings (empty: valid; else its error) before anything
  // is created, so one rank's malformed variable fails every rank at once, naming it, and leaves
  // nothing in /dev/shm. One small allgather, at setup only.
  std::vector<char> verdicts(static_cast<size_t>(size) * kVerdictBytes, '\0');
  char* const verdict = verdicts.data() + static_cast<size_t>(rank) * kVerdictBytes;
  if (!settings.ok()) {
    std::snprintf(verdict, kVerdictBytes, "%s", settings.message().c_str());
    if (settings.message().size() >= kVerdictBytes) std::memcpy(verdict + kVerdictBytes - 4, "...", 4);
  }
  Status exchanged = transport([&](CollectiveContext& ctx) {
    return run_allgatherv(ctx, verdict, verdicts.data(),
                          std::vector<size_t>(static_cast<size_t>(size), kVerdictBytes));
  });
  if (!settings.ok()) return settings;  // this rank's own: names the variable and its value
  if (!exchanged.ok()) return exchanged.with_context("shared-memory setup: exchanging the ranks' settings");
  for (int r = 0; r < size; ++r) {
    const char* theirs = verdicts.data() + static_cast<size_t>(r) * kVerdictBytes;
    if (theirs[0] == '\0') continue;
    return invalid_argument_error(
        "shared-memory setup for {}: rank {}: {}; set the same valid value on every rank, or unset it", label, r,
        std::string(theirs, strnlen(theirs, kVerdictBytes)));
  }
  // By default only where it was measured to win: 2 ranks, each with a CPU. With more ranks than
  // CPUs the total copying work decides, and P - 1 kernel copies took more than one copy into the
  // segment plus P - 1 user copies out of it (4 ranks on 2 cores, 512 KiB and up: 1.5-2.2x
  // slower; bench/README.md, 2026-11-24); more than 2 ranks with a CPU each is not measured yet.
  if (!forced_single_copy &&
      (size > 2 || size > static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))))) {
    single_copy = false;
  }
  // No window opened here (the default): no probe, and no PR_SET_PTRACER for a copy never made.
  if (broadcast_window.min > broadcast_window.max && allgather_window.min > allgather_window.max) single_copy = false;
  const size_t bytes = kDataOffset + static_cast<size_t>(size) * (kSlotBytes + kRingBytes);
  char name[kNameBytes] = {};
  std::string failure;
  int fd = -1;
  if (rank == 0) {
    std::random_device random;
    uint64_t nonce = (static_cast<uint64_t>(random()) << 32) ^ random();
    std::snprintf(name, sizeof(name), "/cohort-%d-%016llx", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(nonce));
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      failure = fmt::format("shm_open({}) failed: {}", name, std::strerror(errno));
    } else if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      failure = fmt::format("ftruncate({}, {}) failed: {} (is /dev/shm large enough?)", name, bytes,
                            std::strerror(errno));
    } else if (int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
      // Reserve the pages now: a sparse tmpfs file on a small /dev/shm (containers default to
      // 64 MiB) would SIGBUS mid-collective instead of falling back to the transport here.
      failure = fmt::format("reserving {} bytes for {} failed: {} (/dev/shm too small? raise its size, "
                            "e.g. docker --shm-size)", bytes, name, std::strerror(error));
    }
    if (!failure.empty()) {
      if (fd >= 0) close(fd);
      shm_unlink(name);
      fd = -1;
      name[0] = '\0';
    }
  }
  Status sent = transport([&](CollectiveContext& ctx) { return run_broadcast(ctx, name, sizeof(name), 0); });
  if (!sent.ok()) {
    if (rank == 0 && name[0] != '\0') shm_unlink(name);
    if (fd >= 0) close(fd);
    return sent.with_context("shared-memory setup: sending the segment name");
  }
  name[kNameBytes - 1] = '\0';
  uint8_t* base = nullptr;
  if (name[0] == '\0') {
    if (failure.empty()) failure = "rank 0 could not create the segment (see its log)";
  } else {
    if (rank != 0) {
      fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
      if (fd < 0) failure = fmt::format("shm_open({}) failed: {} (another /dev/shm?)", name, std::strerror(errno));
    }
    struct stat st {};
    if (fd >= 0 && (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes)) {
      failure = fmt::format("{} has {} bytes, expected {}", name, st.st_size, bytes);
    }
    if (failure.empty()) {
      // MAP_POPULATE: every page is mapped now, not at its first touch inside a collective (posts
      // move through the whole slot, post_area; a page's first touch costs a fault per process).
      void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
      if (mapped == MAP_FAILED)
        failure = fmt::format("mmap of {} ({} bytes) failed: {}", name, bytes, std::strerror(errno));
      else
        base = static_cast<uint8_t*>(mapped);
    }
    if (fd >= 0) close(fd);
  }
  std::unique_ptr<SharedMemoryEngine> engine;
  if (base != nullptr) {
    engine.reset(new SharedMemoryEngine(rank, size, label, base, bytes));
    Control& mine = engine->control(rank);
    uint64_t start = 0;
    char state = '?';
    read_proc_stat(static_cast<int>(getpid()), &state, &start);
    mine.start_time.store(start, std::memory_order_relaxed);
    mine.pid.store(static_cast<int32_t>(getpid()), std::memory_order_release);
    mine.cpu.store(-1, std::memory_order_relaxed);  // not yet published from any CPU
    if (single_copy) {
      // Under Yama's ptrace_scope 1 only a process's ancestors may read its memory; let the
      // sibling ranks (any process of this user, as OpenMPI's vader BTL does). Scope 2 and 3
      // refuse regardless: the probe below finds that and the ranks keep two copies.
      std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
      int value = 0;
      if (scope >> value && value == 1) allow_sibling_readers();
      std::random_device random;
      engine->probe_word_ = (static_cast<uint64_t>(random()) << 32) ^ random() ^ 1u;  // never 0
      mine.probe_value.store(engine->probe_word_, std::memory_order_relaxed);
      mine.probe_address.store(reinterpret_cast<uintptr_t>(&engine->probe_word_), std::memory_order_relaxed);
    } else {
      mine.probe_address.store(0, std::memory_order_relaxed);
    }
  }
  // Every rank has tried to map it: agree, then unlink everywhere (whoever survives cleans up).
  int64_t mapped = base != nullptr ? 1 : 0;
  Status agreed = transport([&](CollectiveContext& ctx) {
    return run_allreduce(ctx, &mapped, 1, DataType::kInt64, ReduceOp::kMin);
  });
  if (name[0] != '\0') shm_unlink(name);
  if (!agreed.ok()) return agreed.with_context("shared-memory setup: agreeing that every rank mapped the segment");
  if (mapped == 0) {
    return failed_precondition_error("shared-memory setup for {} failed on some rank{}", label,
                                     failure.empty() ? "" : " (here: " + failure + ")");
  }
  engine->oversubscribed_ = size > static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  engine->spin_time_ = spin_time;
  engine->poll_time_ = poll_time;
  // The peers' identities, for the liveness checks.
  engine->in_process_ = true;
  for (int r = 0; r < size; ++r) {
    Control& c = engine->control(r);
    engine->pids_[r] = c.pid.load(std::memory_order_acquire);
    engine->start_times_[r] = c.start_time.load(std::memory_order_relaxed);
    if (engine->pids_[r] != static_cast<int>(getpid())) engine->in_process_ = false;
    char state = '?';
    uint64_t start = 0;
    // A pid this rank cannot see with the same start time belongs to another pid namespace: no
    // liveness check for it (the deadline still bounds every wait).
    engine->liveness_checkable_[r] =
        read_proc_stat(engine->pids_[r], &state, &start) && start == engine->start_times_[r];
  }
  COHORT_RETURN_IF_ERROR(engine->agree_on_single_copy(single_copy, broadcast_window, allgather_window, deadline));
  return engine;
}

uint64_t SharedMemoryEngine::single_copy_operations() {
  return g_single_copy_operations.load(std::memory_order_relaxed);
}

Status SharedMemoryEngine::agree_on_single_copy(bool wanted, SingleCopyWindow broadcast, SingleCopyWindow allgather,
                                                Deadline deadline) {
  // Each rank reads every peer's probe word (published before the setup's transport agreement,
  // which every rank has passed) and states its verdict in its Control; one barrier later all
  // ranks see the same verdicts and decide alike.
  std::string why;
  if (!wanted) {
    why = "turned off here (no COHORT_SHM_CMA_*_BYTES window, COHORT_SHM_CMA=0, or more than 2 ranks or ranks "
          "than CPUs without COHORT_SHM_CMA=1)";
  }
  for (int p = 0; p < size_ && why.empty(); ++p) {
    if (p == rank_) continue;
    Control& c = control(p);
    const uint64_t address = c.probe_address.load(std::memory_order_relaxed);
    if (address == 0) {
      why = fmt::format("rank {} has it turned off", p);
      break;
    }
    uint64_t word = 0;
    iovec local{&word, sizeof(word)};
    iovec remote{reinterpret_cast<void*>(address), sizeof(word)};
    const ssize_t n = process_vm_readv(pids_[p], &local, 1, &remote, 1, 0);
    if (n != static_cast<ssize_t>(sizeof(word))) {
      why = fmt::format("process_vm_readv from rank {} (pid {}) failed: {}", p, pids_[p],
                        n < 0 ? std::strerror(errno) : "short read");
    } else if (word != c.probe_value.load(std::memory_order_relaxed)) {
      // Another pid namespace: the pid in the segment is not the peer's here.
      why = fmt::format("process_vm_readv from rank {} (pid {}) read another process's memory", p, pids_[p]);
    }
  }
  Control& mine = control(rank_);
  mine.single_copy_ok.store(why.empty() ? 1 : 0, std::memory_order_relaxed);
  mine.oversubscribed.store(oversubscribed_ ? 1 : 0, std::memory_order_relaxed);
  const size_t windows[4] = {broadcast.min, broadcast.max, allgather.min, allgather.max};
  for (int i = 0; i < 4; ++i) mine.windows[i].store(windows[i], std::memory_order_relaxed);
  COHORT_RETURN_IF_ERROR(step(deadline, "shared-memory setup"));
  // The broadcast's piece size follows from it, so every rank must take the same: rank 0's (CPU
  // counts can differ between containers that share a /dev/shm).
  oversubscribed_ = control(0).oversubscribed.load(std::memory_order_relaxed) != 0;
  bool all = true;
  for (int p = 0; p < size_ && all; ++p) {
    if (control(p).single_copy_ok.load(std::memory_order_relaxed) == 0) {
      all = false;
      if (why.empty()) why = fmt::format("rank {} cannot use it or has it turned off (see its debug log)", p);
    }
  }
  if (all) {
    Control& first = control(0);
    broadcast_window_ = {first.windows[0].load(std::memory_order_relaxed), first.windows[1].load(std::memory_order_relaxed)};
    allgather_window_ = {first.windows[2].load(std::memory_order_relaxed), first.windows[3].load(std::memory_order_relaxed)};
  } else {
    spdlog::debug("{}: shared memory keeps two copies per message (no single copy with process_vm_readv): {}",
                  label_, why);
  }
  return ok_status();
}

void SharedMemoryEngine::expose(const void* data, size_t bytes) {
  Control& mine = control(rank_);
  // Relaxed: the next publish's release of `arrive` carries them.
  mine.exposed_address.store(reinterpret_cast<uintptr_t>(data), std::memory_order_relaxed);
  mine.exposed_bytes.store(bytes, std::memory_order_relaxed);
}

void SharedMemoryEngine::withdraw_exposure() {
  Control& mine = control(rank_);
  mine.exposed_bytes.store(0, std::memory_order_seq_cst);
  mine.exposed_address.store(0, std::memory_order_seq_cst);
  // Before the caller's program writes to the buffer again (a store's release would not order
  // those later writes after it on every architecture).
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

Status SharedMemoryEngine::read_exposed(int peer, size_t offset, void* local_data, size_t bytes, const char* op) {
  Control& c = control(peer);
  const uint64_t address = c.exposed_address.load(std::memory_order_relaxed);
  const uint64_t exposed = c.exposed_bytes.load(std::memory_order_relaxed);
  auto given_up = [&] {
    failure_ = aborted_error(
        "{} over shared memory on {}: rank {} gave this operation up (it timed out or failed) before rank {} had "
        "read its buffer; see rank {}'s error, and create a new communicator",
        op, label_, peer, rank_, peer);
    return failure_;
  };
  if (bytes == 0) return ok_status();
  // Withdrawn (either field may be seen cleared first).
  if (address == 0 || exposed == 0) return given_up();
  if (offset + bytes > exposed) {
    failure_ = internal_error(
        "{} over shared memory on {}: rank {} exposed {} bytes, rank {} expected {}; do all ranks issue the same "
        "collective with the same sizes?",
        op, label_, peer, exposed, rank_, offset + bytes);
    return failure_;
  }
  auto* mine = static_cast<uint8_t*>(local_data);
  for (size_t done = 0; done < bytes;) {
    iovec local{mine + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(address + offset + done), bytes - done};
    const ssize_t n = process_vm_readv(pids_[peer], &local, 1, &remote, 1, 0);
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      Status alive = check_alive(peer, op);
      failure_ = !alive.ok() ? alive
                             : unavailable_error("{} over shared memory on {}: rank {} reading {} bytes of rank {}'s "
                                                 "buffer (pid {}) with process_vm_readv failed: {}",
                                                 op, label_, rank_, bytes - done, peer, pids_[peer],
                                                 std::strerror(error));
      return failure_;
    }
    done += static_cast<size_t>(n);
  }
  // The peer withdraws before it returns an error, and its program may reuse the buffer from then
  // on: if it did during the copy, the copy is void (seqlock order: the copy's reads, then this).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (c.exposed_address.load(std::memory_order_seq_cst) != address ||
      c.exposed_bytes.load(std::memory_order_seq_cst) != exposed) {
    return given_up();
  }
  return ok_status();
}

Status SharedMemoryEngine::broadcast_single_copy(void* buf, size_t bytes, int root, Deadline deadline) {
  // Split copy. The readers read the head of the message straight from the root's buffer
  // (process_vm_readv), while the root copies the tail into its own slots; then each reader copies
  // the tail out of the segment. So both cores copy at once and no rank writes into another's
  // buffer (a root writing into its readers' buffers was faster still, but could write into a
  // buffer whose reader had timed out and returned: review, 2026-11-24).
  // Phase 1: the root exposes its buffer. Phase 2: the root has copied the tail into its slots.
  // A reader ends phase 2 once it has both parts; the root returns once every reader has (its
  // buffer and slots are no longer read), a reader once it has its copy.
  if (!failure_.ok()) return publish("broadcast");  // the failure, named
  uint8_t* data = static_cast<uint8_t*>(buf);
  const size_t head = split_head(bytes);
  if (rank_ == root) {
    // A root that gives up withdraws its buffer before returning (read_exposed).
    // The tail goes into the bank of phase 1, as a two-copy write would: free once every peer has
    // ended our last phase (writable), which needs no reader of this broadcast to have come yet.
    Status status = writable(deadline, "broadcast");
    const int tail_bank = bank();
    if (status.ok()) {
      expose(data, head);
      status = publish("broadcast");
    }
    if (status.ok()) {
      std::memcpy(input(rank_, tail_bank), data + head, bytes - head);
      status = publish("broadcast");
    }
    for (int p = 0; p < size_ && status.ok(); ++p) {
      if (p != rank_) status = await(p, arrived_, deadline, "broadcast");
    }
    if (!status.ok()) {
      withdraw_exposure();
      return status;
    }
    known_ = arrived_;
  } else {
    COHORT_RETURN_IF_ERROR(publish("broadcast"));
    COHORT_RETURN_IF_ERROR(await(root, arrived_, deadline, "broadcast"));
    COHORT_RETURN_IF_ERROR(read_exposed(root, 0, data, head, "broadcast"));
    COHORT_RETURN_IF_ERROR(await(root, arrived_ + 1, deadline, "broadcast"));
    std::memcpy(data + head, input(root, 1 - bank()), bytes - head);  // the root's bank of phase 1
    COHORT_RETURN_IF_ERROR(publish("broadcast"));
  }
  g_single_copy_operations.fetch_add(1, std::memory_order_relaxed);
  return ok_status();
}

size_t SharedMemoryEngine::split_head(size_t bytes) {
  // The readers' share of the copy, the same on every rank (it decides where the tail starts).
  // Half each way measured best at 2 ranks from 64 KiB to 1 MiB (a third at 2 MiB, within 10 %):
  // bench/README.md, 2026-11-24 05:55. Whole cache lines; what does not fit the root's slots (two
  // chunks) goes to the head.
  const size_t head = (bytes / 2) & ~size_t{63};
  return std::max(head, bytes > 2 * kShmChunkBytes ? bytes - 2 * kShmChunkBytes : size_t{0});
}

Status SharedMemoryEngine::allgather_single_copy(const void* send, void* recv, const std::vector<size_t>& bytes,
                                                 Deadline deadline) {
  // Two phases: in the first every rank exposes its block and reads each peer's as soon as that
  // peer has exposed it; the second is a barrier, after which no peer reads this rank's block.
  if (!failure_.ok()) return publish("allgather");  // the failure, named
  const std::vector<size_t> displ = displacements(bytes);
  auto* out = static_cast<uint8_t*>(recv);
  expose(send, bytes[rank_]);
  Status status = publish("allgather");
  if (status.ok() && out + displ[rank_] != send) std::memcpy(out + displ[rank_], send, bytes[rank_]);
  // Starting after this rank, so the ranks do not all read rank 0 first.
  for (int i = 1; i < size_ && status.ok(); ++i) {
    const int p = (rank_ + i) % size_;
    if (bytes[p] == 0) continue;
    status = await(p, arrived_, deadline, "allgather");
    if (status.ok()) status = read_exposed(p, 0, out + displ[p], bytes[p], "allgather");
  }
  // step() ends this rank's phase before it waits: a peer still reading `send` when this rank
  // gives up must find it withdrawn (read_exposed), since the program may reuse it at once.
  if (status.ok()) status = step(deadline, "allgather");
  if (!status.ok()) {
    withdraw_exposure();
    return status;
  }
  g_single_copy_operations.fetch_add(1, std::memory_order_relaxed);
  return ok_status();
}

SharedMemoryEngine::SharedMemoryEngine(int rank, int size, std::string label, uint8_t* base, size_t bytes)
    : rank_(rank),
      size_(size),
      label_(std::move(label)),
      base_(base),
      bytes_(bytes),
      pids_(size, 0),
      start_times_(size, 0),
      liveness_checkable_(size, false) {}

SharedMemoryEngine::~SharedMemoryEngine() { munmap(base_, bytes_); }

SharedMemoryEngine::Control& SharedMemoryEngine::control(int r) const {
  static_assert(offsetof(Control, inline_data) + sizeof(Control::inline_data) <= 64,
                "the inline data must share the first cache line with `arrive`");
  static_assert(sizeof(Control) <= kControlBytes, "a Control must fit its kControlBytes");
  return *reinterpret_cast<Control*>(base_ + static_cast<size_t>(r) * kControlBytes);
}

uint8_t* SharedMemoryEngine::input(int r, int bank) const {
  return base_ + kDataOffset + static_cast<size_t>(r) * kSlotBytes + static_cast<size_t>(bank) * 2 * kShmChunkBytes;
}

uint8_t* SharedMemoryEngine::ring_entry(int r, uint32_t generation) const {
  return base_ + kDataOffset + static_cast<size_t>(size_) * kSlotBytes + static_cast<size_t>(r) * kRingBytes +
         static_cast<size_t>(generation % kShmRingEntries) * kRingEntryBytes;
}

std::atomic<uint64_t>& SharedMemoryEngine::ring_tag(uint8_t* entry) {
  static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t) && std::atomic<uint64_t>::is_always_lock_free,
                "a tag in shared memory is a plain lock-free word");
  return *reinterpret_cast<std::atomic<uint64_t>*>(entry + kRingTagOffset);
}

uint8_t* SharedMemoryEngine::post_area(int r, uint32_t phase, size_t bytes) const {
  const int bank = static_cast<int>(phase & 1u);
  if (bytes <= kShmInlineBytes) return control(r).inline_data[bank];
  if (bytes < kShmRotateMinBytes) return input(r, bank);
  // Every caller posts at most a chunk; more would leave no second place (and divide by zero).
  if (bytes > kShmChunkBytes) std::abort();
  // The bank's input and result regions, in page-aligned places of `bytes`, one after another on
  // each use of the bank (every second phase), so the rotating posts come back to a place only
  // after going through the bank, by when the peers have mostly read on past it
  // (kShmRotateMinBytes; ops with fixed regions may write in between, which only costs speed).
  // Any place in the bank is free to write in `phase`: every peer has ended phase - 1, and with
  // it every read of this bank's earlier contents (the protocol in the header).
  const size_t stride = (bytes + 4095) & ~size_t{4095};
  const size_t places = 2 * kShmChunkBytes / stride;
  return input(r, bank) + ((phase >> 1) % places) * stride;
}

uint8_t* SharedMemoryEngine::result(int r, int bank) const { return input(r, bank) + kShmChunkBytes; }

Status SharedMemoryEngine::check_alive(int peer, const char* op) const {
  if (!liveness_checkable_[peer]) return ok_status();
  ProcessIdentity process;
  process.pid = pids_[peer];
  process.start_time = start_times_[peer];
  if (!process_gone(process)) return ok_status();
  return unavailable_error(
      "{} over shared memory on {}: rank {} (pid {}) has exited while rank {} waited for it; the group lost a "
      "rank (see that rank's log for why)",
      op, label_, peer, pids_[peer], rank_);
}

Status SharedMemoryEngine::wait_for(int peer, uint32_t target, Deadline deadline, const char* op) {
  Control& c = control(peer);
  auto reached = [&] { return static_cast<int32_t>(c.arrive.load(std::memory_order_acquire) - target) >= 0; };
  // Poll, and past poll_time_ yield between polls, until spin_time_; then sleep in the futex. A
  // core per rank is not a given: a futex wake-up tends to pull the woken rank onto its waker's
  // core, and on a busy machine two ranks then share one, where a pure poll keeps the peer off
  // the core for the whole poll. sched_yield hands the core to such a peer at once and returns
  // at once when nothing else waits for it (OpenMPI's yield_when_idle). So a waiter yields from
  // the first miss when the peer last published from this CPU, or when oversubscribed; it does
  // not yield early otherwise, since on a busy machine a yield hands the core to another
  // program's process, possibly for a whole time slice.
  // A first short poll before any clock or CPU reading: at 8 B the peer has usually arrived by
  // then, and those readings took about 5 % of a 2-rank 8 B reduce_scatter (perf). Oversubscribed,
  // one look: the peer is likely waiting for this core.
  for (int i = 0, n = oversubscribed_ ? 1 : 16; i < n; ++i) {
    if (reached()) return ok_status();
    cpu_relax();
  }
  const int here = sched_getcpu();
  auto colocated = [&] { return here >= 0 && c.cpu.load(std::memory_order_relaxed) == here; };
  const auto start = Clock::now();
  const auto pure_until = start + (oversubscribed_ ? std::chrono::microseconds(0) : poll_time_);
  const auto spin_until = start + spin_time_;
  const int polls = oversubscribed_ ? 1 : 64;
  while (true) {
    for (int i = 0; i < polls; ++i) {
      if (reached()) return ok_status();
      cpu_relax();
    }
    const auto now = Clock::now();
    if (now >= spin_until) break;
    if (now >= pure_until || colocated()) sched_yield();
  }
  while (true) {
    // Announce the sleep before the last look, so the peer's bump either is seen here or sees us.
    c.waiters.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = c.arrive.load(std::memory_order_seq_cst);
    if (static_cast<int32_t>(seen - target) >= 0) {
      c.waiters.fetch_sub(1, std::memory_order_seq_cst);
      return ok_status();
    }
    Duration slice = std::min(kShmLivenessInterval, deadline.remaining());
    if (slice.count() > 0) futex_wait(c.arrive, seen, slice);
    c.waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (reached()) return ok_status();
    COHORT_RETURN_IF_ERROR(check_alive(peer, op));
    if (deadline.expired()) {
      return deadline_exceeded_error(
          "{} over shared memory on {}: timed out after {} waiting for rank {} (pid {}) at generation {}; is "
          "it alive, stopped, or issuing a different collective?",
          op, label_, format_duration(deadline.budget()), peer, pids_[peer], target);
    }
  }
}

Status SharedMemoryEngine::publish(const char* op) {
  if (!failure_.ok()) {
    return failed_precondition_error("{} over shared memory on {}: an earlier operation failed ({}); create a new "
                                     "communicator", op, label_, failure_.message());
  }
  ++arrived_;
  ++phases_;
  Control& mine = control(rank_);
  // Release: this phase's writes to our slot are visible to whoever sees the new generation.
  mine.cpu.store(sched_getcpu(), std::memory_order_relaxed);
  mine.arrive.store(arrived_, std::memory_order_seq_cst);
  if (mine.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(mine.arrive);
  return ok_status();
}

Status SharedMemoryEngine::await(int peer, uint32_t target, Deadline deadline, const char* op) {
  Status arrived = wait_for(peer, target, deadline, op);
  if (!arrived.ok()) failure_ = arrived;
  return arrived;
}

Status SharedMemoryEngine::step(Deadline deadline, const char* op) {
  COHORT_RETURN_IF_ERROR(publish(op));
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) COHORT_RETURN_IF_ERROR(await(p, arrived_, deadline, op));
  }
  known_ = arrived_;
  return ok_status();
}

Status SharedMemoryEngine::writable(Deadline deadline, const char* op) {
  if (static_cast<int32_t>(known_ - arrived_) >= 0) return ok_status();
  if (!failure_.ok()) return publish(op);  // the failure, named
  for (int p = 0; p < size_; ++p) {
    if (p != rank_) COHORT_RETURN_IF_ERROR(await(p, arrived_, deadline, op));
  }
  known_ = arrived_;
  return ok_status();
}

StatusOr<std::vector<uint64_t>> SharedMemoryEngine::exchange_rows(const std::vector<uint64_t>& row,
                                                                  Deadline deadline, const char* op) {
  COHORT_RETURN_IF_ERROR(writable(deadline, op));
  std::memcpy(input(rank_, bank()), row.data(), row.size() * sizeof(uint64_t));
  COHORT_RETURN_IF_ERROR(step(deadline, op));
  std::vector<uint64_t> rows(static_cast<size_t>(size_) * size_);
  for (int p = 0; p < size_; ++p) {
    std::memcpy(&rows[static_cast<size_t>(p) * size_], input(p, 1 - bank()), size_ * sizeof(uint64_t));
  }
  return rows;
}

Status SharedMemoryEngine::allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                     int root, Deadline deadline) {
  if (count == 0) return ok_status();
  const char* what = root < 0 ? "allreduce" : "reduce";
  const size_t esize = element_size(dtype);
  const uint8_t* in = static_cast<const uint8_t*>(send != nullptr ? send : recv);
  uint8_t* out = static_cast<uint8_t*>(recv);
  const bool wants = root < 0 || root == rank_;
  const bool streaming = count * esize >= kShmStreamingStoreBytes;
  const size_t chunk_elems = kShmChunkBytes / esize;
  COHORT_RETURN_IF_ERROR(writable(deadline, what));
  if (count <= chunk_elems && count * esize <= kShmDirectReduceBytes) {
    // Small: one barrier; each rank reduces the whole message straight into its output, slot by
    // slot in rank order, so every rank's result is bit-identical.
    const size_t n = count * esize;
    const uint32_t phase = arrived_;
    std::memcpy(post_area(rank_, phase, n), in, n);
    COHORT_RETURN_IF_ERROR(step(deadline, what));
    if (wants) {
      reduce_to(out, post_area(0, phase, n), post_area(1, phase, n), count, dtype, op);
      for (int p = 2; p < size_; ++p) reduce_into(out, post_area(p, phase, n), count, dtype, op);
    }
    return ok_status();
  }
  // Pipelined reduce-scatter + allgather: step t posts chunk t, reduces this rank's slice of
  // chunk t-1 into its result region (and its own output), and copies out the peers' slices of
  // chunk t-2. A rank posts every slice but its own: it alone reduces that one, reading it from
  // `in` directly (a quarter fewer bytes moved at 2 ranks than posting and copying it back).
  // In place, out's own slice of chunk t-1 is written only after that reduction read it.
  const size_t chunks = (count + chunk_elems - 1) / chunk_elems;
  auto chunk_len = [&](size_t c) { return std::min(chunk_elems, count - c * chunk_elems); };
  for (size_t t = 0; t <= chunks + 1; ++t) {
    const int b = bank(), pb = 1 - b;
    if (t < chunks) {
      const size_t n = chunk_len(t);
      auto [lo, hi] = share(n, size_, rank_);
      const uint8_t* src = in + t * chunk_elems * esize;
      std::memcpy(input(rank_, b), src, lo * esize);
      std::memcpy(input(rank_, b) + hi * esize, src + hi * esize, (n - hi) * esize);
    }
    if (t >= 1 && t <= chunks) {
      const size_t c = t - 1;
      auto [lo, hi] = share(chunk_len(c), size_, rank_);
      if (hi > lo) {
        // Rank order, as the small path: every slice is reduced the same way wherever it is.
        auto source = [&](int p) -> const uint8_t* {
          return p == rank_ ? in + (c * chunk_elems + lo) * esize : input(p, pb) + lo * esize;
        };
        uint8_t* dst = result(rank_, b) + lo * esize;
        reduce_to(dst, source(0), source(1), hi - lo, dtype, op);
        for (int p = 2; p < size_; ++p) reduce_into(dst, source(p), hi - lo, dtype, op);
        if (wants) copy_out(out + (c * chunk_elems + lo) * esize, dst, (hi - lo) * esize, streaming);
      }
    }
    if (t >= 2 && wants) {
      size_t c = t - 2;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        auto [lo, hi] = share(chunk_len(c), size_, p);
        copy_out(out + (c * chunk_elems + lo) * esize, result(p, pb) + lo * esize, (hi - lo) * esize, streaming);
      }
    }
    if (t <= chunks) COHORT_RETURN_IF_ERROR(step(deadline, what));
  }
  return ok_status();
}

Status SharedMemoryEngine::reduce_scatterv(const void* send, void* recv, const std::vector<size_t>& counts,
                                           DataType dtype, ReduceOp op, Deadline deadline) {
  const size_t esize = element_size(dtype);
  size_t total = 0;
  for (size_t n : counts) total += n;
  if (total == 0) return ok_status();
  const uint8_t* in = static_cast<const uint8_t*>(send != nullptr ? send : recv);
  uint8_t* out = static_cast<uint8_t*>(recv);
  const size_t mine_begin = std::accumulate(counts.begin(), counts.begin() + rank_, size_t{0});
  const size_t mine_end = mine_begin + counts[rank_];
  COHORT_RETURN_IF_ERROR(writable(deadline, "reduce_scatter"));
  const size_t chunk_elems = kShmChunkBytes / esize;
  const size_t chunks = (total + chunk_elems - 1) / chunk_elems;
  // Step t posts chunk t and reduces the part of chunk t-1 inside this rank's block straight into
  // recv. In place, recv's block is written below chunk t, which is already posted.
  // One chunk of at most kShmInlineBytes travels in the flag's line (post_area).
  const size_t posted = chunks == 1 ? total * esize : kShmChunkBytes;
  for (size_t t = 0; t <= chunks; ++t) {
    const uint32_t phase = arrived_, previous = phase - 1;  // previous: the peers' posts of chunk t-1
    if (t < chunks) {
      size_t first = t * chunk_elems, n = std::min(chunk_elems, total - first);
      std::memcpy(post_area(rank_, phase, posted), in + first * esize, n * esize);
    }
    if (t >= 1) {
      size_t first = (t - 1) * chunk_elems, last = std::min(total, first + chunk_elems);
      size_t lo = std::max(first, mine_begin), hi = std::min(last, mine_end);
      if (lo < hi) {
        uint8_t* dst = out + (lo - mine_begin) * esize;
        size_t offset = (lo - first) * esize;
        reduce_to(dst, post_area(0, previous, posted) + offset, post_area(1, previous, posted) + offset, hi - lo,
                  dtype, op);
        for (int p = 2; p < size_; ++p) reduce_into(dst, post_area(p, previous, posted) + offset, hi - lo, dtype, op);
      }
    }
    if (t < chunks) COHORT_RETURN_IF_ERROR(step(deadline, "reduce_scatter"));
  }
  return ok_status();
}

Status SharedMemoryEngine::stream(const uint8_t* source, const std::vector<size_t>& lengths,
                                  const Consume& consume, Deadline deadline, const char* op, uint8_t* own_out) {
  size_t chunks = 0, longest = 0;
  for (size_t n : lengths) chunks = std::max(chunks, chunks_of(n)), longest = std::max(longest, n);
  if (chunks == 0) return ok_status();
  // Every rank's posts take places of the same size (post_area), known to all: the lengths are.
  const size_t posted = std::min(kShmChunkBytes, longest);
  COHORT_RETURN_IF_ERROR(writable(deadline, op));
  for (size_t t = 0; t <= chunks; ++t) {
    const uint32_t phase = arrived_, previous_phase = phase - 1;
    size_t first = t * kShmChunkBytes;
    if (t < chunks && first < lengths[rank_]) {
      size_t n = std::min(kShmChunkBytes, lengths[rank_] - first);
      uint8_t* slot = post_area(rank_, phase, posted);
      if (own_out != nullptr) {
        copy_in_and_stream_out(slot, own_out + first, source + first, n);
      } else {
        std::memcpy(slot, source + first, n);
        // This rank's own part, chunk by chunk while the source chunk is still in cache (one pass
        // over the whole source first read it from memory twice).
        consume(rank_, first, source + first, n);
      }
    }
    if (t >= 1) {
      size_t previous = (t - 1) * kShmChunkBytes;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || previous >= lengths[p]) continue;
        consume(p, previous, post_area(p, previous_phase, posted), std::min(kShmChunkBytes, lengths[p] - previous));
      }
    }
    if (t < chunks) COHORT_RETURN_IF_ERROR(step(deadline, op));
  }
  return ok_status();
}

size_t SharedMemoryEngine::broadcast_piece(size_t bytes) const {
  // Oversubscribed, every piece may cost the readers a scheduling slice: whole chunks.
  if (oversubscribed_) return kShmChunkBytes;
  size_t quarter = (bytes / 4 + 63) & ~size_t{63};
  return std::min(kShmChunkBytes, std::max(kShmBroadcastMinPieceBytes, quarter));
}

Status SharedMemoryEngine::broadcast(void* buf, size_t bytes, int root, Deadline deadline) {
  // Root and readers only: the root posts piece k in its phase and ends the phase without
  // waiting; a reader ends its phase first (it is done with the pieces before) and then waits for
  // the root's and copies the piece out. The root's `writable` waits for the readers two pieces
  // back, so pieces pipeline and a small broadcast costs the root no round trip.
  uint8_t* data = static_cast<uint8_t*>(buf);
  if (bytes > 0 && bytes <= kShmInlineBytes) {
    // Tiny: through the root's ring, indexed by generation, so the root may run up to
    // kShmRingEntries - 2 broadcasts ahead of its slowest reader (the entry it writes was read
    // kShmRingEntries phases ago). Oversubscribed, each process then does many broadcasts per
    // time slice instead of one (OpenMPI's eager broadcast does the same).
    if (rank_ == root) {
      // After a failure nothing in the ring changes: publish() names the failure.
      if (!failure_.ok()) return publish("broadcast");
      const uint32_t readers_done = arrived_ - static_cast<uint32_t>(kShmRingEntries - 2);
      if (static_cast<int32_t>(known_ - readers_done) < 0) {
        for (int p = 0; p < size_; ++p) {
          if (p != rank_) COHORT_RETURN_IF_ERROR(await(p, readers_done, deadline, "broadcast"));
        }
        known_ = readers_done;
      }
      uint8_t* entry = ring_entry(rank_, arrived_);
      std::memcpy(entry, data, bytes);
      // Release: the data is visible to a reader that sees the tag: the phase count the publish
      // below makes (the entry's earlier tags are whole rings of phases back, or 0).
      ring_tag(entry).store(phases_ + 1, std::memory_order_release);
      return publish("broadcast");
    }
    COHORT_RETURN_IF_ERROR(publish("broadcast"));
    uint8_t* entry = ring_entry(root, arrived_ - 1);
    // The entry's tag first (the root usually runs ahead: the data is there); the root's flag,
    // with its futex and liveness checks, when it is not there yet after a short poll.
    // Oversubscribed, one look: the root likely waits for this core (as in wait_for).
    bool tagged = false;
    for (int i = 0, polls = oversubscribed_ ? 1 : kRingTagPolls; i < polls && !tagged; ++i) {
      tagged = ring_tag(entry).load(std::memory_order_acquire) == phases_;
      if (!tagged) cpu_relax();
    }
    if (!tagged) COHORT_RETURN_IF_ERROR(await(root, arrived_, deadline, "broadcast"));
    std::memcpy(data, entry, bytes);
    return ok_status();
  }
  if (broadcast_window_.covers(bytes)) return broadcast_single_copy(buf, bytes, root, deadline);
  const size_t piece = broadcast_piece(bytes);
  const size_t posted = std::min(piece, bytes);  // a place of the piece's size (a 1 KiB message: 1 KiB)
  const bool streaming = bytes >= kShmStreamingStoreBytes;
  for (size_t first = 0; first < bytes; first += piece) {
    const size_t n = std::min(piece, bytes - first);
    if (rank_ == root) {
      COHORT_RETURN_IF_ERROR(writable(deadline, "broadcast"));
      std::memcpy(post_area(rank_, arrived_, posted), data + first, n);
      COHORT_RETURN_IF_ERROR(publish("broadcast"));
    } else {
      COHORT_RETURN_IF_ERROR(publish("broadcast"));
      COHORT_RETURN_IF_ERROR(await(root, arrived_, deadline, "broadcast"));
      copy_out(data + first, post_area(root, arrived_ - 1, posted), n, streaming);  // the root's last phase
    }
  }
  return ok_status();
}

Status SharedMemoryEngine::gatherv(const void* send, void* recv, const std::vector<size_t>& bytes, int root,
                                   Deadline deadline) {
  if (root < 0 && allgather_window_.covers(std::accumulate(bytes.begin(), bytes.end(), size_t{0}))) {
    return allgather_single_copy(send, recv, bytes, deadline);
  }
  if (root < 0 && std::all_of(bytes.begin(), bytes.end(), [](size_t n) { return n <= kShmChunkBytes; })) {
    // One chunk from every rank: a single barrier, and none of the streaming's bookkeeping (at
    // 8 B its allocations cost as much as the barrier). Lengths are the same on every rank, so
    // all of them skip an empty one together.
    if (std::all_of(bytes.begin(), bytes.end(), [](size_t n) { return n == 0; })) return ok_status();
    COHORT_RETURN_IF_ERROR(writable(deadline, "allgather"));
    const auto* in = static_cast<const uint8_t*>(send);
    uint8_t* out = static_cast<uint8_t*>(recv);
    const size_t mine = std::accumulate(bytes.begin(), bytes.begin() + rank_, size_t{0});
    const uint32_t phase = arrived_;
    std::memcpy(post_area(rank_, phase, bytes[rank_]), in, bytes[rank_]);
    if (out + mine != in) std::memcpy(out + mine, in, bytes[rank_]);
    COHORT_RETURN_IF_ERROR(step(deadline, "allgather"));
    size_t offset = 0;
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) std::memcpy(out + offset, post_area(p, phase, bytes[p]), bytes[p]);
      offset += bytes[p];
    }
    return ok_status();
  }
  std::vector<size_t> lengths = bytes;
  if (root >= 0) {
    // Only this rank's own length is certain off the root: learn everyone's.
    std::vector<uint64_t> row(size_, 0);
    row[0] = bytes[rank_];
    COHORT_ASSIGN_OR_RETURN(std::vector<uint64_t> rows, exchange_rows(row, deadline, "gather"));
    for (int p = 0; p < size_; ++p) lengths[p] = rows[static_cast<size_t>(p) * size_];
  }
  std::vector<size_t> displ = displacements(lengths);
  uint8_t* out = static_cast<uint8_t*>(recv);
  const bool wants = root < 0 || root == rank_;
  const bool streaming = displ.back() + lengths.back() >= kShmStreamingStoreBytes;
  // Streaming, this rank's own block is written out in the pass that copies it into the slot.
  uint8_t* own_out = wants && streaming && out + displ[rank_] != send ? out + displ[rank_] : nullptr;
  return stream(
      static_cast<const uint8_t*>(send), lengths,
      [&](int p, size_t offset, const uint8_t* data, size_t n) {
        uint8_t* dst = out + displ[p] + offset;
        if (wants && dst != data) copy_out(dst, data, n, streaming);
      },
      deadline, root < 0 ? "allgather" : "gather", own_out);
}

Status SharedMemoryEngine::scatterv(const void* send, void* recv, const std::vector<size_t>& bytes, int root,
                                    Deadline deadline) {
  // The root's counts are the ones that matter: everyone learns them.
  std::vector<uint64_t> row(size_, 0);
  if (rank_ == root) std::copy(bytes.begin(), bytes.end(), row.begin());
  COHORT_ASSIGN_OR_RETURN(std::vector<uint64_t> rows, exchange_rows(row, deadline, "scatter"));
  std::vector<size_t> blocks(rows.begin() + static_cast<ptrdiff_t>(root) * size_,
                             rows.begin() + static_cast<ptrdiff_t>(root + 1) * size_);
  std::vector<size_t> displ = displacements(blocks);
  std::vector<size_t> lengths(size_, 0);
  lengths[root] = displ.back() + blocks.back();
  const size_t begin = displ[rank_], end = begin + std::min(blocks[rank_], bytes[rank_]);
  uint8_t* out = static_cast<uint8_t*>(recv);
  return stream(
      static_cast<const uint8_t*>(send), lengths,
      [&](int, size_t offset, const uint8_t* data, size_t n) {
        size_t lo = std::max(offset, begin), hi = std::min(offset + n, end);
        if (lo < hi) std::memcpy(out + (lo - begin), data + (lo - offset), hi - lo);
      },
      deadline, "scatter");
}

Status SharedMemoryEngine::alltoallv(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                                     const std::vector<size_t>& recv_bytes, Deadline deadline) {
  std::vector<uint64_t> row(send_bytes.begin(), send_bytes.end());
  COHORT_ASSIGN_OR_RETURN(std::vector<uint64_t> rows, exchange_rows(row, deadline, "alltoall"));
  // Where this rank's block starts in each peer's stream, and how long it is.
  std::vector<size_t> lengths(size_, 0), from(size_, 0), length_for_me(size_, 0);
  for (int p = 0; p < size_; ++p) {
    for (int q = 0; q < size_; ++q) {
      size_t n = rows[static_cast<size_t>(p) * size_ + q];
      if (q == rank_) {
        from[p] = lengths[p];
        length_for_me[p] = std::min(n, recv_bytes[p]);
      }
      lengths[p] += n;
    }
  }
  std::vector<size_t> rdispl = displacements(recv_bytes);
  uint8_t* out = static_cast<uint8_t*>(recv);
  return stream(
      static_cast<const uint8_t*>(send), lengths,
      [&](int p, size_t offset, const uint8_t* data, size_t n) {
        size_t lo = std::max(offset, from[p]), hi = std::min(offset + n, from[p] + length_for_me[p]);
        if (lo < hi) std::memcpy(out + rdispl[p] + (lo - from[p]), data + (lo - offset), hi - lo);
      },
      deadline, "alltoall");
}

Status SharedMemoryEngine::barrier(Deadline deadline) { return step(deadline, "barrier"); }

}  // namespace cohort::comm
