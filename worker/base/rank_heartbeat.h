#pragma once

// RankHeartbeat: tells the node agent that this rank's process is alive, from a thread of its
// own, by touching the file the agent names in COHORT_HEARTBEAT_FILE every interval. A rank busy
// in a long computation (or a long collective) keeps beating, so it is never taken for hung; a rank
// whose every thread is stopped or frozen stops beating, and the agent kills it after its
// heartbeat timeout (daemon/agent/task_supervisor.h, "Hang detection") instead of letting its
// peers wait for the collective timeout.
//
// cohort-worker starts one; any program launched by an agent (a command job) may do the same, or
// just `touch "$COHORT_HEARTBEAT_FILE"` from a loop of its own. Outside an agent (no variable) it
// does nothing.
//
//   std::unique_ptr<cohort::RankHeartbeat> heartbeat = cohort::RankHeartbeat::from_environment();
//   ... train; the beat goes on until `heartbeat` is destroyed ...
//
// Thread-safe; the destructor stops the thread (blocking up to one interval's wake-up).

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace cohort {

// How often a rank beats: a fifth of the agent's default heartbeat timeout (10 s), so a few late
// beats under load never look like a hang.
inline constexpr std::chrono::milliseconds kDefaultRankHeartbeatInterval = std::chrono::seconds(2);
// The variable the agent sets to the rank's heartbeat file.
inline constexpr const char* kHeartbeatFileVariable = "COHORT_HEARTBEAT_FILE";
// The variable the agent sets to the beat interval it expects, in whole milliseconds (its
// task_heartbeat_interval_ms setting), so that the interval and the agent's timeout are configured
// in one place.
inline constexpr const char* kHeartbeatIntervalVariable = "COHORT_HEARTBEAT_INTERVAL_MS";
// The intervals a rank accepts from kHeartbeatIntervalVariable (and the agent's setting allows):
// faster than 50 ms is a busy loop of file writes, slower than 10 minutes detects nothing.
inline constexpr std::chrono::milliseconds kMinRankHeartbeatInterval = std::chrono::milliseconds(50);
inline constexpr std::chrono::milliseconds kMaxRankHeartbeatInterval = std::chrono::minutes(10);

class RankHeartbeat {
 public:
  // Beats into `path` every `interval`, starting now. The file is created (mode 0600) if missing.
  RankHeartbeat(std::string path, std::chrono::milliseconds interval = kDefaultRankHeartbeatInterval);
  // Stops beating.
  ~RankHeartbeat();
  RankHeartbeat(const RankHeartbeat&) = delete;
  RankHeartbeat& operator=(const RankHeartbeat&) = delete;

  // A heartbeat into $COHORT_HEARTBEAT_FILE; nullptr when it is unset or empty. It beats every
  // $COHORT_HEARTBEAT_INTERVAL_MS when that is a whole number of milliseconds within
  // [kMinRankHeartbeatInterval, kMaxRankHeartbeatInterval], else every `interval` (a bad value is
  // said once on stderr).
  static std::unique_ptr<RankHeartbeat> from_environment(
      std::chrono::milliseconds interval = kDefaultRankHeartbeatInterval);

  // The interval it beats at. Non-blocking.
  std::chrono::milliseconds interval() const { return interval_; }

  // Beats so far that reached the file (for tests). Non-blocking.
  long beats() const;

 private:
  void beat();
  void loop();

  const std::string path_;
  const std::chrono::milliseconds interval_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  long beats_ = 0;         // guarded by mu_
  bool warned_ = false;    // beat() only (the constructor, then the thread)
  std::thread thread_;
};

}  // namespace cohort
