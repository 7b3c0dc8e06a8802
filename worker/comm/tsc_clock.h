#pragma once

// TscClock: steady_clock's time, read from the CPU's time-stamp counter.
//
// steady_clock::now() costs about 25 ns here (a vDSO call that orders the counter read and scales
// it under a sequence lock); a communicator reads the clock twice per collective (the deadline and
// the record's start, the record's end and the blocked time), a third of an 8-byte intra-node
// collective. The counter itself reads in a few nanoseconds. Where the kernel keeps
// CLOCK_MONOTONIC on that same counter (clocksource "tsc", which the kernel only picks when the
// counter is invariant and in step across cores) and the CPU says the counter is invariant, steady
// time is a straight line of the counter between the kernel's rate corrections. So this clock
// reads the counter and maps it through an anchor pair (counter, steady_clock) re-taken at most
// kTscReanchor apart, at the rate measured over the previous anchoring period:
// - each pair is kept only when nothing came between its three readings (kMaxTscPairTicks), so
//   its own error is tens of nanoseconds: about 2e-4 of the rate over the first 1 ms base
//   (kTscCalibration; about 10 us by the end of the first period), a few parts per million over a
//   50 ms period after;
// - a period whose rate differs from the last by more than kMaxTscRateChange, or is out of range
//   (a paused VM, a clocksource change, a counter reset or jump, the kernel slewing hard), starts
//   the calibration over, reading steady_clock meanwhile;
// - a counter whose rate is out of range from a fresh base, or whose pairs never fit
//   (kMaxRejectedTscPairs in a row), is given up for good;
// - readings never go back (a re-anchoring may step back by the rate's error: the clock holds).
// Elsewhere (another architecture, another clocksource, a hypervisor that hides the invariant
// counter bit) it reads steady_clock.
//
// Not thread-safe: one owner at a time (a communicator's run-token holder); now() never blocks.

#include <cstdint>
#include <type_traits>

#include "worker/comm/deadline.h"

namespace cohort::comm {

inline constexpr std::chrono::milliseconds kTscCalibration{1};
inline constexpr std::chrono::milliseconds kTscReanchor{50};
// A pair's two counter readings around steady_clock's must be this close (about 200 ns at
// 2.5 GHz; the three readings take about 40 ns together): wider, an interrupt came between them.
inline constexpr uint64_t kMaxTscPairTicks = 500;
// Rates outside 0.2 to 20 GHz mean the counter is not what it seemed: steady_clock from then on.
inline constexpr double kMinNanosecondsPerTick = 0.05;
inline constexpr double kMaxNanosecondsPerTick = 5.0;
// A period's rate this far (relative) from the last starts the calibration over.
inline constexpr double kMaxTscRateChange = 1e-3;
// This many interrupted pairs in a row: the counter is given up (see slow_now()).
inline constexpr int kMaxRejectedTscPairs = 64;

// Whether this machine's counter can stand in for steady_clock (see above): x86-64, CPUID's
// invariant counter bit, and the kernel's current clocksource "tsc". Reads sysfs on the first
// call and caches the answer; thread-safe.
bool tsc_counter_usable();

// The real counter and reference clock.
struct HardwareTimeSource {
  uint64_t counter() const {
#if defined(__x86_64__)
    return __builtin_ia32_rdtsc();
#else
    return 0;  // tsc_counter_usable() is false
#endif
  }
  Clock::time_point reference() const { return Clock::now(); }
};

// `Source` gives counter() and reference(): tests pass a scripted one.
template <typename Source>
class BasicTscClock {
 public:
  // `allow_counter` false always reads the reference clock.
  explicit BasicTscClock(bool allow_counter, Source source = Source())
      : source_(source), allowed_(allow_counter) {
    slow_now();  // the first base: the calibration starts now
  }

  Clock::time_point now() {
    if (calibrated_) {
      const uint64_t since = source_.counter() - anchor_ticks_;  // wraps past the period when behind
      if (since < period_ticks_) {
        return monotone(anchor_time_ + Clock::duration(static_cast<Clock::rep>(static_cast<double>(since) *
                                                                               nanoseconds_per_tick_)));
      }
    }
    return slow_now();
  }

  // Whether readings now come from the counter (false while calibrating and where it is unusable).
  bool using_counter() const { return calibrated_; }

 private:
  static_assert(std::is_same_v<Clock::duration::period, std::nano>, "counter ticks map to nanoseconds");

  Clock::time_point monotone(Clock::time_point t) {
    if (t < last_) return last_;
    last_ = t;
    return t;
  }

  void restart(uint64_t ticks, Clock::time_point time) {
    base_ticks_ = ticks;
    base_time_ = time;
    calibrated_ = false;
  }

  // A fresh pair: the first base, a calibration step, or the next period's anchor and rate.
  Clock::time_point slow_now() {
    if (!allowed_) return monotone(source_.reference());
    const uint64_t before = source_.counter();
    const Clock::time_point time = source_.reference();
    const uint64_t after = source_.counter();
    if (after - before > kMaxTscPairTicks) {
      // Interrupted: pair at a later reading. Where no pair ever fits (a counter the hypervisor
      // traps, a reference clock that is a system call), give the counter up rather than pay for
      // three readings at every call.
      if (++rejected_pairs_ >= kMaxRejectedTscPairs) {
        allowed_ = false;
        calibrated_ = false;
      }
      return monotone(time);
    }
    rejected_pairs_ = 0;
    const uint64_t ticks = before + (after - before) / 2;
    if (!started_) {
      started_ = true;
      restart(ticks, time);
      return monotone(time);
    }
    const Clock::duration since = time - base_time_;
    // Calibrated, and here early: the counter read behind the anchor (another core's, a hair
    // behind). Nothing to learn from so short a base.
    if (calibrated_ && since < kTscCalibration) return monotone(time);
    // The counter went back or stood still against the reference: it was reset, or is not this
    // machine's steady counter after all.
    if (ticks <= base_ticks_ || since.count() <= 0) {
      restart(ticks, time);
      return monotone(time);
    }
    if (!calibrated_ && since < kTscCalibration) return monotone(time);
    const double rate = static_cast<double>(since.count()) / static_cast<double>(ticks - base_ticks_);
    if (!(rate > kMinNanosecondsPerTick && rate < kMaxNanosecondsPerTick)) {
      if (calibrated_) {
        // A jump of the counter (rewritten by firmware, a migrated VM): calibrate anew.
        restart(ticks, time);
      } else {
        // Out of range from a fresh base: not a clock this can use.
        allowed_ = false;
      }
      return monotone(time);
    }
    if (calibrated_ && (rate > nanoseconds_per_tick_ * (1 + kMaxTscRateChange) ||
                        rate < nanoseconds_per_tick_ * (1 - kMaxTscRateChange))) {
      restart(ticks, time);
      return monotone(time);
    }
    nanoseconds_per_tick_ = rate;
    anchor_ticks_ = ticks;
    anchor_time_ = time;
    period_ticks_ = static_cast<uint64_t>(
        static_cast<double>(std::chrono::duration_cast<Clock::duration>(kTscReanchor).count()) / rate);
    base_ticks_ = ticks;  // the next period's rate is measured from here
    base_time_ = time;
    calibrated_ = true;
    return monotone(time);
  }

  Source source_;
  bool allowed_;
  bool started_ = false;
  bool calibrated_ = false;
  int rejected_pairs_ = 0;   // in a row
  uint64_t base_ticks_ = 0;  // where the rate being measured started
  Clock::time_point base_time_;
  uint64_t anchor_ticks_ = 0;  // the mapping in use
  Clock::time_point anchor_time_;
  uint64_t period_ticks_ = 0;
  double nanoseconds_per_tick_ = 0;
  Clock::time_point last_;  // the latest reading handed out
};

class TscClock : public BasicTscClock<HardwareTimeSource> {
 public:
  TscClock() : BasicTscClock(tsc_counter_usable()) {}
  explicit TscClock(bool allow_counter) : BasicTscClock(allow_counter) {}
};

}  // namespace cohort::comm
