#include "worker/comm/tsc_clock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace cohort::comm {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// How far a reading may be from steady_clock's, read just before and after it: the counter's
// mapping is good to microseconds; the slack is for a preemption between the three readings.
constexpr microseconds kTolerance{500};

void expect_between(Clock::time_point before, Clock::time_point reading, Clock::time_point after) {
  EXPECT_GE(reading, before - kTolerance) << "the reading is "
                                          << std::chrono::duration_cast<microseconds>(before - reading).count()
                                          << " us before steady_clock";
  EXPECT_LE(reading, after + kTolerance) << "the reading is "
                                         << std::chrono::duration_cast<microseconds>(reading - after).count()
                                         << " us after steady_clock";
}

TEST(TscClockTest, FollowsSteadyClockThroughCalibrationAndReanchoring) {
  TscClock clock;
  // Past calibration and through several re-anchorings, with busy stretches and sleeps between.
  const Clock::time_point end = Clock::now() + kTscCalibration + 4 * kTscReanchor;
  int readings = 0;
  while (Clock::now() < end) {
    for (int i = 0; i < 1000; ++i) {
      const Clock::time_point before = Clock::now();
      const Clock::time_point reading = clock.now();
      const Clock::time_point after = Clock::now();
      expect_between(before, reading, after);
      ++readings;
      if (::testing::Test::HasFailure()) return;
    }
    std::this_thread::sleep_for(milliseconds(3));
  }
  EXPECT_GT(readings, 1000);
  if (TscClock::counter_usable()) {
    EXPECT_TRUE(clock.using_counter()) << "the counter is usable here but the clock never calibrated";
  } else {
    GTEST_LOG_(INFO) << "this machine's counter cannot stand in for steady_clock: every reading was steady_clock's";
    EXPECT_FALSE(clock.using_counter());
  }
}

TEST(TscClockTest, DurationsMatchSteadyClock) {
  TscClock clock;
  // Calibrate first.
  const Clock::time_point calibrated = Clock::now() + 2 * kTscCalibration;
  while (Clock::now() < calibrated) {
    clock.now();
    std::this_thread::sleep_for(milliseconds(1));
  }
  for (int round = 0; round < 5; ++round) {
    const Clock::time_point steady_start = Clock::now();
    const Clock::time_point start = clock.now();
    std::this_thread::sleep_for(milliseconds(7));
    const Clock::time_point end = clock.now();
    const Clock::time_point steady_end = Clock::now();
    const auto measured = end - start;
    EXPECT_GE(measured, milliseconds(7) - kTolerance);
    EXPECT_LE(measured, (steady_end - steady_start) + kTolerance);
  }
}

TEST(TscClockTest, WithoutTheCounterItIsSteadyClock) {
  TscClock clock(/*allow_counter=*/false);
  for (int i = 0; i < 100; ++i) {
    const Clock::time_point before = Clock::now();
    const Clock::time_point reading = clock.now();
    const Clock::time_point after = Clock::now();
    EXPECT_GE(reading, before);
    EXPECT_LE(reading, after);
  }
  std::this_thread::sleep_for(kTscCalibration + milliseconds(5));
  clock.now();
  EXPECT_FALSE(clock.using_counter());
}

}  // namespace
}  // namespace cohort::comm
