#pragma once

// TscClock: steady_clock's time, read from the CPU's time-stamp counter.
//
// steady_clock::now() costs about 25 ns here (a vDSO call that orders the counter read and scales
// it under a sequence lock); a communicator reads the clock twice per collective (the deadline and
// the record's start, the record's end and the blocked time), which is a third of an 8-byte
// intra-node collective. The counter itself reads in a few nanoseconds. Where the kernel keeps
// CLOCK_MONOTONIC on that same counter (clocksource "tsc", which the kernel only picks when the
// counter is invariant and in step across cores) and the CPU says it is invariant, steady time is
// a straight line of the counter between the kernel's small rate corrections, so this clock reads
// the counter and maps it through an anchor pair (counter, steady_clock) taken at most
// kTscReanchor apart, with the rate measured from its first anchor (taken when the clock is
// made), so the rate's error shrinks as the clock lives: readings stay within microseconds of
// steady_clock (a pair's jitter of tens of nanoseconds over the 1 ms first base is 1e-4 of the
// rate, a few microseconds over a re-anchoring period). Elsewhere (another architecture, another clocksource, a VM that
// does not pass the invariant-counter bit) it is steady_clock::now().
//
// Not thread-safe: one owner at a time (a communicator's run-token holder). Anchoring reads
// steady_clock, and until the rate is known (the first kTscCalibration after construction)
// every reading is steady_clock's own.

#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "worker/comm/deadline.h"

namespace cohort::comm {

inline constexpr std::chrono::milliseconds kTscCalibration{1};
inline constexpr std::chrono::milliseconds kTscReanchor{50};

class TscClock {
 public:
  // `allow_counter` false always reads steady_clock (tests, and where the counter is unusable).
  explicit TscClock(bool allow_counter = counter_usable());

  Clock::time_point now() {
#if defined(__x86_64__)
    if (calibrated_) {
      const uint64_t ticks = read_counter();
      if (ticks - anchor_ticks_ < reanchor_ticks_) {
        return anchor_time_ + Clock::duration(static_cast<Clock::rep>(
                                  static_cast<double>(ticks - anchor_ticks_) * nanoseconds_per_tick_));
      }
    }
#endif
    return slow_now();
  }

  // Whether readings come from the counter (false before calibration and where it is unusable).
  bool using_counter() const { return calibrated_; }

  // Whether this machine's counter can stand in for steady_clock (see the header comment).
  static bool counter_usable();

 private:
  static uint64_t read_counter() {
#if defined(__x86_64__)
    return __rdtsc();
#else
    return 0;
#endif
  }
  // A fresh anchor (or, before calibration, a step of it), and steady_clock's reading.
  Clock::time_point slow_now();

  bool allowed_;
  bool calibrated_ = false;
  bool started_ = false;
  uint64_t first_ticks_ = 0;
  Clock::time_point first_time_;
  uint64_t anchor_ticks_ = 0;
  Clock::time_point anchor_time_;
  uint64_t reanchor_ticks_ = 0;
  double nanoseconds_per_tick_ = 0;
};

}  // namespace cohort::comm
