#include "daemon/server/systemd_notifier.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

namespace cohort::daemon {

SystemdNotifier::~SystemdNotifier() { stop_watchdog(); }

void SystemdNotifier::stop_watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_changed_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

bool SystemdNotifier::under_systemd() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && *socket != '\0';
}

std::optional<std::chrono::milliseconds> SystemdNotifier::watchdog_interval() {
  uint64_t usec = 0;
  // > 0: WATCHDOG_USEC is set and WATCHDOG_PID (if any) is this process.
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) <= 0 || usec == 0) return std::nullopt;
  // Half the timeout: one late ping (a busy machine) still lands in time.
  return std::chrono::milliseconds(std::max<uint64_t>(1, usec / 2000));
}

Status SystemdNotifier::notify(const std::string& state) {
  if (!under_systemd()) return ok_status();
  const int rc = sd_notify(/*unset_environment=*/0, state.c_str());
  if (rc < 0) return errno_status("sd_notify(" + state.substr(0, state.find('\n')) + ")", -rc);
  return ok_status();
}

Status SystemdNotifier::notify_ready(const std::string& status) {
  return notify("READY=1\nSTATUS=" + status);
}

Status SystemdNotifier::notify_stopping(const std::string& status) {
  return notify("STOPPING=1\nSTATUS=" + status);
}

void SystemdNotifier::start_watchdog(std::function<bool()> healthy) {
  std::optional<std::chrono::milliseconds> interval = watchdog_interval();
  if (!interval.has_value() || watchdog_.joinable()) return;
  spdlog::info("systemd watchdog: pinging every {} ms", interval->count());
  watchdog_ = std::thread(
      [this, period = *interval, healthy = std::move(healthy)] { watchdog_loop(period, healthy); });
}

void SystemdNotifier::watchdog_loop(std::chrono::milliseconds interval,
                                    const std::function<bool()>& healthy) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    if (!healthy || healthy()) {
      Status pinged = notify("WATCHDOG=1");
      if (!pinged.ok()) spdlog::warn("systemd watchdog ping failed: {}", pinged.to_string());
    } else {
      // No ping: systemd restarts the daemon once WatchdogSec passes without one.
      spdlog::error("systemd watchdog: the daemon's loops made no progress recently; not pinging");
    }
    lock.lock();
    stop_changed_.wait_for(lock, interval, [this] { return stopping_; });
  }
}

}  // namespace cohort::daemon
