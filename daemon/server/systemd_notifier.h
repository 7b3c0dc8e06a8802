#pragma once

// SystemdNotifier: cohortd's side of systemd's Type=notify protocol (sd_notify(3)). READY=1 once
// the server listens, so `systemctl start` returns only when the daemon can take calls (and units
// ordered After= it start after); STOPPING=1 when a drain begins; WATCHDOG=1 pings at half of
// WATCHDOG_USEC when the unit sets WatchdogSec=, from a thread that stops with the notifier, but
// only while the daemon says it is healthy (its own loops make progress), so a hung daemon is
// restarted. Outside systemd (no NOTIFY_SOCKET) every call is a no-op.
//
//   SystemdNotifier systemd;
//   systemd.notify_ready(fmt::format("listening on {}", address));
//   systemd.start_watchdog([&] { return server->healthy(); });
//   ... SIGTERM ...
//   systemd.notify_stopping();
//
// Thread-safe.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "worker/base/status.h"

namespace cohort::daemon {

class SystemdNotifier {
 public:
  SystemdNotifier() = default;
  // Stops the watchdog thread.
  ~SystemdNotifier();
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  // Whether systemd listens (NOTIFY_SOCKET is set).
  static bool under_systemd();
  // The ping period: half of WATCHDOG_USEC when this process is the one systemd watches.
  static std::optional<std::chrono::milliseconds> watchdog_interval();

  // READY=1 with a STATUS= line. The error names sd_notify and its errno; OK outside systemd.
  Status notify_ready(const std::string& status);
  // STOPPING=1 with a STATUS= line.
  Status notify_stopping(const std::string& status);
  // Starts pinging WATCHDOG=1 every watchdog_interval() (nothing when the watchdog is off), each
  // time only if `healthy` (called on the watchdog thread; empty: always) returns true, so a
  // daemon whose work loops are stuck stops pinging and systemd restarts it.
  void start_watchdog(std::function<bool()> healthy = {});
  // Stops and joins the watchdog thread (no more `healthy` calls after it returns). Idempotent.
  void stop_watchdog();

 private:
  static Status notify(const std::string& state);
  void watchdog_loop(std::chrono::milliseconds interval, const std::function<bool()>& healthy);

  std::mutex mu_;
  std::condition_variable stop_changed_;
  bool stopping_ = false;  // guarded by mu_
  std::thread watchdog_;
};

}  // namespace cohort::daemon
