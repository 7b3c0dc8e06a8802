#pragma once

// Clock: the coordinator's one source of time, injected so that leases, placement and job
// timestamps are tested by advancing a FakeClock instead of sleeping (STYLE rule 7).
//
// Two readings, because they serve different purposes:
//   now()         monotonic; leases and durations. Never jumps when the wall clock is set.
//   unix_millis() wall time; timestamps people read in job records and events.
//
// Blocking waits on real threads (rendezvous, watch) use std::chrono::steady_clock directly: a fake
// clock cannot wake a condition variable, and those waits bound real threads.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include <fmt/format.h>

namespace cohort::coordinator {

using Duration = std::chrono::milliseconds;
using TimePoint = std::chrono::steady_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic time. Thread-safe, non-blocking.
  virtual TimePoint now() const = 0;
  // Milliseconds since the Unix epoch. Thread-safe, non-blocking.
  virtual int64_t unix_millis() const = 0;
};

// The real clocks.
class SystemClock final : public Clock {
 public:
  TimePoint now() const override { return std::chrono::steady_clock::now(); }
  int64_t unix_millis() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

// A clock that moves only when told to; both readings advance together. Thread-safe.
class FakeClock final : public Clock {
 public:
  // 2023-11-14T22:13:20Z: an arbitrary, recognisable start for wall-time readings.
  static constexpr int64_t kDefaultStartUnixMillis = 1'700'000'000'000;

  explicit FakeClock(int64_t start_unix_millis = kDefaultStartUnixMillis)
      : start_unix_millis_(start_unix_millis) {}

  TimePoint now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return TimePoint() + elapsed_;
  }
  int64_t unix_millis() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return start_unix_millis_ + elapsed_.count();
  }

  // Moves both readings forward by `delta`.
  void advance(Duration delta) {
    std::lock_guard<std::mutex> lock(mu_);
    elapsed_ += delta;
  }

 private:
  mutable std::mutex mu_;
  const int64_t start_unix_millis_;
  Duration elapsed_{0};
};

// "1.5 s", "250 ms": a duration as people read it in error messages.
inline std::string format_duration(Duration d) {
  if (d.count() >= 1000) return fmt::format("{:.1f} s", static_cast<double>(d.count()) / 1000.0);
  return fmt::format("{} ms", d.count());
}

}  // namespace cohort::coordinator
