#include "worker/base/rank_heartbeat.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace cohort {

RankHeartbeat::RankHeartbeat(std::string path, std::chrono::milliseconds interval)
    : path_(std::move(path)), interval_(interval) {
  beat();  // at once: the agent holds a rank to the timeout only after its first beat
  thread_ = std::thread([this] { loop(); });
}

RankHeartbeat::~RankHeartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::unique_ptr<RankHeartbeat> RankHeartbeat::from_environment(std::chrono::milliseconds interval) {
  const char* path = std::getenv(kHeartbeatFileVariable);
  if (path == nullptr || *path == '\0') return nullptr;
  if (const char* text = std::getenv(kHeartbeatIntervalVariable); text != nullptr && *text != '\0') {
    errno = 0;
    char* end = nullptr;
    const long long ms = std::strtoll(text, &end, 10);
    if (*end == '\0' && errno == 0 && ms >= kMinRankHeartbeatInterval.count() &&
        ms <= kMaxRankHeartbeatInterval.count()) {
      interval = std::chrono::milliseconds(ms);
    } else {
      std::fprintf(stderr, "cohort: %s='%s' is not a whole number of milliseconds in %lld..%lld; beating every %lld ms\n",
                   kHeartbeatIntervalVariable, text, static_cast<long long>(kMinRankHeartbeatInterval.count()),
                   static_cast<long long>(kMaxRankHeartbeatInterval.count()),
                   static_cast<long long>(interval.count()));
    }
  }
  return std::make_unique<RankHeartbeat>(path, interval);
}

long RankHeartbeat::beats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return beats_;
}

void RankHeartbeat::beat() {
  // The mtime is the beat (the agent compares it between looks); the count is for people.
  int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    // Not fatal: without beats the agent watches the process state alone. Said once.
    if (!warned_) {
      warned_ = true;
      std::fprintf(stderr, "cohort: cannot write heartbeat file %s: %s\n", path_.c_str(), std::strerror(errno));
    }
    return;
  }
  long count = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    count = ++beats_;
  }
  // Fixed width, written over the old count and truncated after: a reader never finds the file
  // empty between a truncate and the write (rank_heartbeat_test read 0 that way under load).
  char text[32];
  int n = std::snprintf(text, sizeof(text), "%20ld\n", count);
  if (::pwrite(fd, text, static_cast<size_t>(n), 0) != n || ::ftruncate(fd, n) != 0) {
    ::futimens(fd, nullptr);  // at least the mtime moves
  }
  ::close(fd);
}

void RankHeartbeat::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, interval_, [this] { return stopping_; })) {
    lock.unlock();
    beat();
    lock.lock();
  }
}

}  // namespace cohort
