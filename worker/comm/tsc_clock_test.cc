#include "worker/comm/tsc_clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace cohort::comm {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

// A scripted counter and reference clock: the test moves both. Each counter() read adds
// `read_cost` ticks (a read takes time), and the one after steady's read adds `pair_gap` more (an
// interrupt between a pair's readings).
struct Script {
  uint64_t ticks = 1'000'000;
  Clock::time_point time{Clock::duration(5'000'000'000)};
  uint64_t read_cost = 10;
  uint64_t pair_gap = 0;
  bool after_reference = false;
  int reference_reads = 0;

  // Both advance by `d` at `ticks_per_ns` (3 = a 3 GHz counter).
  void advance(nanoseconds d, double ticks_per_ns = 3.0) {
    time += d;
    ticks += static_cast<uint64_t>(static_cast<double>(d.count()) * ticks_per_ns);
  }
};

struct ScriptedSource {
  Script* script;
  uint64_t counter() const {
    script->ticks += script->read_cost;
    if (script->after_reference) {
      script->ticks += script->pair_gap;
      script->after_reference = false;
    }
    return script->ticks;
  }
  Clock::time_point reference() const {
    script->after_reference = true;
    ++script->reference_reads;
    return script->time;
  }
};

using ScriptedClock = BasicTscClock<ScriptedSource>;

// Calibrates `clock` against `script` at 3 GHz: past kTscCalibration, one reading.
void calibrate(ScriptedClock& clock, Script& script) {
  script.advance(kTscCalibration + microseconds(100));
  clock.now();
}

TEST(TscClockTest, ReadsTheCounterOnceCalibrated) {
  Script script;
  ScriptedClock clock(true, ScriptedSource{&script});
  EXPECT_FALSE(clock.using_counter());
  script.advance(microseconds(500));
  EXPECT_EQ(clock.now(), script.time) << "before kTscCalibration the reference's own reading";
  calibrate(clock, script);
  ASSERT_TRUE(clock.using_counter());
  const Clock::time_point anchor = script.time;
  const int reference_reads = script.reference_reads;
  // 30 us of counter at 3 GHz, the reference clock not moved: the reading comes from the counter.
  script.ticks += 90'000;
  const auto ahead = clock.now() - anchor;
  EXPECT_NEAR(static_cast<double>(ahead.count()), 30'000.0, 100.0);
  EXPECT_EQ(script.reference_reads, reference_reads) << "a calibrated reading read the reference clock";
}

TEST(TscClockTest, FollowsTheReferenceAcrossPeriodsAndNeverGoesBack) {
  Script script;
  script.read_cost = 0;  // tens of thousands of readings: their own ticks would add up
  ScriptedClock clock(true, ScriptedSource{&script});
  calibrate(clock, script);
  Clock::time_point last = clock.now();
  // 20 periods; the reference runs 200 ppm slower than the counter says in the odd ones (the
  // kernel slewing), so a re-anchoring after one steps the mapping back by up to 10 us: readings
  // 2 us apart would go back there but for the hold.
  for (int period = 0; period < 20; ++period) {
    const double ticks_per_ns = period % 2 == 0 ? 3.0 : 3.0 * (1 + 2e-4);
    for (int step = 0; step < 25'000; ++step) {
      script.advance(microseconds(2), ticks_per_ns);
      const Clock::time_point reading = clock.now();
      ASSERT_GE(reading, last) << "period " << period << " step " << step << ": the clock went back";
      ASSERT_LE(std::chrono::abs(reading - script.time), microseconds(20))
          << "period " << period << " step " << step << ": "
          << std::chrono::duration_cast<nanoseconds>(reading - script.time).count()
          << " ns off the reference";
      last = reading;
    }
  }
  EXPECT_TRUE(clock.using_counter());
}

TEST(TscClockTest, AnInterruptedPairIsNotAnAnchor) {
  Script script;
  script.pair_gap = 10 * kMaxTscPairTicks;
  ScriptedClock clock(true, ScriptedSource{&script});
  for (int i = 0; i < 5; ++i) {
    script.advance(milliseconds(2));
    EXPECT_EQ(clock.now(), script.time);
  }
  EXPECT_FALSE(clock.using_counter()) << "calibrated from pairs an interrupt split";
  script.pair_gap = 0;
  script.advance(milliseconds(2));
  clock.now();  // the first whole pair: the base
  calibrate(clock, script);
  EXPECT_TRUE(clock.using_counter());
}

TEST(TscClockTest, ARateOutOfRangeGivesUpTheCounter) {
  Script script;
  ScriptedClock clock(true, ScriptedSource{&script});
  // 1000 ticks in 2 ms: a 500 kHz "counter".
  script.time += milliseconds(2);
  script.ticks += 1000;
  EXPECT_EQ(clock.now(), script.time);
  for (int i = 0; i < 5; ++i) {
    script.advance(milliseconds(60));
    EXPECT_EQ(clock.now(), script.time);
  }
  EXPECT_FALSE(clock.using_counter());
}

TEST(TscClockTest, APausedMachineOrAResetCounterStartsTheCalibrationOver) {
  Script script;
  ScriptedClock clock(true, ScriptedSource{&script});
  calibrate(clock, script);
  ASSERT_TRUE(clock.using_counter());
  // The reference moves 100 ms while the counter moves 60 ms (a paused VM): past the period, the
  // rate is off by far more than kMaxTscRateChange.
  script.time += milliseconds(100);
  script.ticks += 180'000'000;
  EXPECT_EQ(clock.now(), script.time);
  EXPECT_FALSE(clock.using_counter());
  calibrate(clock, script);
  EXPECT_TRUE(clock.using_counter());
  // The counter restarts from near zero.
  script.ticks = 5000;
  script.advance(milliseconds(60));
  EXPECT_EQ(clock.now(), script.time);
  EXPECT_FALSE(clock.using_counter());
  calibrate(clock, script);
  EXPECT_TRUE(clock.using_counter());
}

TEST(TscClockTest, ACounterJumpForwardStartsTheCalibrationOver) {
  Script script;
  ScriptedClock clock(true, ScriptedSource{&script});
  calibrate(clock, script);
  ASSERT_TRUE(clock.using_counter());
  // The counter leaps by an hour's worth of ticks while the reference moves 60 ms: an
  // out-of-range rate from a calibrated clock is a jump, not a bad counter.
  script.ticks += 3ull * 1000 * 1000 * 1000 * 3600;
  script.advance(milliseconds(60));
  EXPECT_EQ(clock.now(), script.time);
  EXPECT_FALSE(clock.using_counter());
  calibrate(clock, script);
  EXPECT_TRUE(clock.using_counter()) << "a counter jump gave the counter up for good";
}

TEST(TscClockTest, PairsThatNeverFitGiveUpTheCounter) {
  Script script;
  script.pair_gap = 10 * kMaxTscPairTicks;
  ScriptedClock clock(true, ScriptedSource{&script});
  for (int i = 0; i < kMaxRejectedTscPairs; ++i) {
    script.advance(microseconds(100));
    clock.now();
  }
  // From now on one reference reading per call, no counter reads.
  const uint64_t ticks = script.ticks;
  const int reference_reads = script.reference_reads;
  script.pair_gap = 0;
  for (int i = 0; i < 100; ++i) {
    script.advance(milliseconds(1));
    EXPECT_EQ(clock.now(), script.time);
  }
  EXPECT_FALSE(clock.using_counter());
  EXPECT_EQ(script.reference_reads, reference_reads + 100);
  EXPECT_EQ(script.ticks - ticks, static_cast<uint64_t>(100 * 3'000'000)) << "the counter was still read";
}

TEST(TscClockTest, WithoutTheCounterItIsTheReference) {
  Script script;
  ScriptedClock clock(false, ScriptedSource{&script});
  for (int i = 0; i < 10; ++i) {
    script.advance(milliseconds(30));
    EXPECT_EQ(clock.now(), script.time);
  }
  EXPECT_FALSE(clock.using_counter());
}

// This machine's real counter against steady_clock: readings between steady_clock's just before
// and just after (with slack for a preemption between the three), through calibration and several
// periods, with busy stretches and sleeps between.
TEST(TscClockTest, TheHardwareClockFollowsSteadyClock) {
  constexpr microseconds kTolerance{500};
  TscClock clock;
  const Clock::time_point end = Clock::now() + kTscCalibration + 4 * kTscReanchor;
  Clock::time_point last = clock.now();
  int readings = 0;
  bool used_counter = false;
  while (Clock::now() < end) {
    used_counter = used_counter || clock.using_counter();
    for (int i = 0; i < 1000; ++i) {
      const Clock::time_point before = Clock::now();
      const Clock::time_point reading = clock.now();
      const Clock::time_point after = Clock::now();
      ASSERT_GE(reading, before - kTolerance)
          << std::chrono::duration_cast<microseconds>(before - reading).count() << " us behind steady_clock";
      ASSERT_LE(reading, after + kTolerance)
          << std::chrono::duration_cast<microseconds>(reading - after).count() << " us ahead of steady_clock";
      ASSERT_GE(reading, last) << "the clock went back";
      last = reading;
      ++readings;
    }
    std::this_thread::sleep_for(milliseconds(3));
  }
  EXPECT_GT(readings, 1000);
  if (tsc_counter_usable()) {
    // At some point: a restart late in the loop (the kernel slewing, say) is fine.
    EXPECT_TRUE(used_counter) << "the counter is usable here but the clock never calibrated";
  } else {
    GTEST_LOG_(INFO)
        << "this machine's counter cannot stand in for steady_clock: every reading was steady_clock's";
    EXPECT_FALSE(used_counter);
  }
}

}  // namespace
}  // namespace cohort::comm
