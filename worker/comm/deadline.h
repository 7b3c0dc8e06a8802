#pragma once

// Time limits of the communication core. Every wait takes a deadline; nothing blocks forever.

#include <chrono>
#include <string>

#include <fmt/format.h>

namespace cohort::comm {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;

// Default limit for one collective or point-to-point operation. Generous because a training step
// may legitimately wait for a slow peer's backward pass; override per call or communicator.
inline constexpr Duration kDefaultCollectiveTimeout = std::chrono::minutes(5);
// Default limit for store operations (rendezvous, key waits).
inline constexpr Duration kDefaultStoreTimeout = std::chrono::minutes(5);

// A point in time by which an operation must finish. Cheap to copy.
class Deadline {
 public:
  static Deadline after(Duration timeout) { return after(timeout, Clock::now()); }
  // The same from a clock reading the caller already has (saves a read on hot paths).
  static Deadline after(Duration timeout, Clock::time_point now) { return Deadline(now + timeout, timeout); }

  bool expired() const { return Clock::now() >= at_; }
  Duration remaining() const {
    auto left = std::chrono::duration_cast<Duration>(at_ - Clock::now());
    return left.count() > 0 ? left : Duration(0);
  }
  Clock::time_point at() const { return at_; }
  // The whole budget this deadline was made with (for error messages: "waited 30.0 s").
  Duration budget() const { return budget_; }

 private:
  Deadline(Clock::time_point at, Duration budget) : at_(at), budget_(budget) {}
  Clock::time_point at_;
  Duration budget_;
};

// "1.5 s", "250 ms": a duration as people read it in error messages.
inline std::string format_duration(Duration d) {
  if (d.count() >= 1000) return fmt::format("{:.1f} s", d.count() / 1000.0);
  return fmt::format("{} ms", d.count());
}

}  // namespace cohort::comm
