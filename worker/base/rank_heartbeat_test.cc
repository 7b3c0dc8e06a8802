#include "worker/base/rank_heartbeat.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace cohort {
namespace {

using namespace std::chrono_literals;

std::string temp_dir() {
  char pattern[] = "/tmp/rank_heartbeat_test.XXXXXX";
  const char* dir = ::mkdtemp(pattern);
  EXPECT_NE(dir, nullptr);
  return dir != nullptr ? dir : "/tmp";
}

struct timespec mtime_of(const std::string& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return info.st_mtim;
}

TEST(RankHeartbeatTest, BeatsAtOnceAndThenEveryInterval) {
  const std::string path = temp_dir() + "/heartbeat-rank-0";
  RankHeartbeat heartbeat(path, 20ms);
  EXPECT_GE(heartbeat.beats(), 1) << "the first beat is written by the constructor";
  const struct timespec first = mtime_of(path);
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (heartbeat.beats() < 4 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  ASSERT_GE(heartbeat.beats(), 4);
  const struct timespec later = mtime_of(path);
  EXPECT_TRUE(later.tv_sec != first.tv_sec || later.tv_nsec != first.tv_nsec) << "the mtime is the beat";
  std::ifstream in(path);
  long count = 0;
  in >> count;
  EXPECT_GE(count, 2);
}

TEST(RankHeartbeatTest, StopsBeatingWhenDestroyed) {
  const std::string path = temp_dir() + "/heartbeat-rank-1";
  { RankHeartbeat heartbeat(path, 10ms); }
  const struct timespec stopped = mtime_of(path);
  std::this_thread::sleep_for(50ms);  // five intervals: a live heartbeat would have moved it
  const struct timespec after = mtime_of(path);
  EXPECT_EQ(after.tv_sec, stopped.tv_sec);
  EXPECT_EQ(after.tv_nsec, stopped.tv_nsec);
}

TEST(RankHeartbeatTest, FromEnvironmentOnlyWhenTheAgentAsks) {
  ::unsetenv(kHeartbeatFileVariable);
  EXPECT_EQ(RankHeartbeat::from_environment(), nullptr);
  const std::string path = temp_dir() + "/heartbeat-rank-2";
  ::setenv(kHeartbeatFileVariable, path.c_str(), 1);
  auto heartbeat = RankHeartbeat::from_environment(1h);
  ASSERT_NE(heartbeat, nullptr);
  EXPECT_EQ(heartbeat->beats(), 1);
  ::unsetenv(kHeartbeatFileVariable);
}

TEST(RankHeartbeatTest, FromEnvironmentTakesTheAgentsInterval) {
  const std::string path = temp_dir() + "/heartbeat-rank-3";
  ::setenv(kHeartbeatFileVariable, path.c_str(), 1);
  ::setenv(kHeartbeatIntervalVariable, "250", 1);
  auto heartbeat = RankHeartbeat::from_environment(1h);
  ASSERT_NE(heartbeat, nullptr);
  EXPECT_EQ(heartbeat->interval(), 250ms);
  // Out of range, not a number, or trailing junk: the caller's default, not a busy loop.
  for (const char* bad : {"10", "abc", "250ms", "-5", "99999999999"}) {
    ::setenv(kHeartbeatIntervalVariable, bad, 1);
    heartbeat = RankHeartbeat::from_environment(1h);
    ASSERT_NE(heartbeat, nullptr);
    EXPECT_EQ(heartbeat->interval(), 1h) << bad;
  }
  ::unsetenv(kHeartbeatIntervalVariable);
  ::unsetenv(kHeartbeatFileVariable);
}

}  // namespace
}  // namespace cohort
