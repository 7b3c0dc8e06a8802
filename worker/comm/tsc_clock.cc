#include "worker/comm/tsc_clock.h"

#include <fstream>
#include <ratio>
#include <string>
#include <type_traits>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace cohort::comm {

namespace {

static_assert(std::is_same_v<Clock::duration::period, std::nano>, "TscClock maps counter ticks to nanoseconds");

// An anchor pair is kept only when the two counter readings around steady_clock's are this close
// (about 1 us at 2 GHz): an interrupt or preemption between them would skew the pair.
constexpr uint64_t kMaxPairTicks = 2000;
// Rates outside 0.2 to 20 GHz mean the counter is not what it seemed: steady_clock from then on.
constexpr double kMinNanosecondsPerTick = 0.05;
constexpr double kMaxNanosecondsPerTick = 5.0;

bool counter_usable_uncached() {
#if defined(__x86_64__)
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  // CPUID 0x80000007, EDX bit 8: the invariant counter (constant rate, runs in every C-state).
  if (__get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) == 0 || (edx & (1u << 8)) == 0) return false;
  std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return static_cast<bool>(source >> name) && name == "tsc";
#else
  return false;
#endif
}

}  // namespace

bool TscClock::counter_usable() {
  static const bool usable = counter_usable_uncached();
  return usable;
}

TscClock::TscClock(bool allow_counter) : allowed_(allow_counter) {
  slow_now();  // the first anchor: the rate's base starts now
}

Clock::time_point TscClock::slow_now() {
  if (!allowed_) return Clock::now();
  const uint64_t before = read_counter();
  const Clock::time_point time = Clock::now();
  const uint64_t after = read_counter();
  if (after - before > kMaxPairTicks) return time;  // interrupted: anchor at a later reading
  const uint64_t ticks = before + (after - before) / 2;
  if (!started_) {
    started_ = true;
    first_ticks_ = ticks;
    first_time_ = time;
    return time;
  }
  const Clock::duration since_first = time - first_time_;
  if (since_first < kTscCalibration || ticks <= first_ticks_) return time;
  // The rate over everything since the first anchor: the longer the base, the smaller the error
  // of the pairs' own jitter, and the kernel's rate corrections are parts per million.
  const double rate = static_cast<double>(since_first.count()) / static_cast<double>(ticks - first_ticks_);
  if (!(rate > kMinNanosecondsPerTick && rate < kMaxNanosecondsPerTick)) {
    allowed_ = false;
    calibrated_ = false;
    return time;
  }
  nanoseconds_per_tick_ = rate;
  anchor_ticks_ = ticks;
  anchor_time_ = time;
  reanchor_ticks_ = static_cast<uint64_t>(
      static_cast<double>(std::chrono::duration_cast<Clock::duration>(kTscReanchor).count()) / rate);
  calibrated_ = true;
  return time;
}

}  // namespace cohort::comm
