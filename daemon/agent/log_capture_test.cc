#include "daemon/agent/log_capture.h"

#include <functional>
#include <string>
#include <thread>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

using testing::TempDir;

TEST(LogCaptureTest, WritesFileAndServesTail) {
  TempDir dir;
  std::string path = dir.path() + "/job-1/rank-0.log";
  auto capture = LogCapture::open(path);
  ASSERT_TRUE(capture.ok()) << capture.status().to_string();
  (*capture)->append("hello ");
  (*capture)->append("world\n");
  EXPECT_EQ((*capture)->tail(6), "world\n");
  EXPECT_EQ((*capture)->tail(1000), "hello world\n");
  EXPECT_EQ((*capture)->size(), 12u);
  (*capture)->close();
  EXPECT_TRUE((*capture)->file_status().ok());
  EXPECT_EQ(testing::read_file(path), "hello world\n");
}

TEST(LogCaptureTest, RingKeepsOnlyTheNewestBytesAndReportsSkipped) {
  TempDir dir;
  auto capture = LogCapture::open(dir.path() + "/rank-0.log", /*ring_bytes=*/8);
  ASSERT_TRUE(capture.ok()) << capture.status().to_string();
  (*capture)->append("0123456789");
  (*capture)->append("abc");
  EXPECT_EQ((*capture)->tail(100), "56789abc");
  LogChunk chunk = (*capture)->read_from(0);
  EXPECT_EQ(chunk.data, "56789abc");
  EXPECT_EQ(chunk.offset, 5u);
  EXPECT_EQ(chunk.skipped, 5u);
  EXPECT_EQ(chunk.next_offset, 13u);
  chunk = (*capture)->read_from(11);
  EXPECT_EQ(chunk.data, "bc");
  EXPECT_EQ(chunk.skipped, 0u);
  // A single chunk larger than the ring keeps its tail.
  (*capture)->append("ABCDEFGHIJKLMNOP");
  EXPECT_EQ((*capture)->tail(100), "IJKLMNOP");
  EXPECT_EQ((*capture)->size(), 29u);
  // The file keeps everything.
  (*capture)->close();
  EXPECT_EQ(testing::read_file(dir.path() + "/rank-0.log"), "0123456789abcABCDEFGHIJKLMNOP");
}

TEST(LogCaptureTest, FollowerWakesOnAppendAndOnClose) {
  TempDir dir;
  auto capture = LogCapture::open(dir.path() + "/rank-0.log");
  ASSERT_TRUE(capture.ok()) << capture.status().to_string();
  LogCapture* log = capture->get();
  std::thread writer([log] {
    log->append("line 1\n");
    log->close();
  });
  std::string followed;
  uint64_t offset = 0;
  for (int i = 0; i < 100; ++i) {
    LogChunk chunk = log->wait_and_read_from(offset, std::chrono::seconds(5));
    followed += chunk.data;
    offset = chunk.next_offset;
    if (chunk.closed && chunk.data.empty()) break;
  }
  writer.join();
  EXPECT_EQ(followed, "line 1\n");
  EXPECT_TRUE(log->read_from(offset).closed);
}

TEST(LogCaptureTest, UnwritableDirectoryIsAnError) {
  auto capture = LogCapture::open("/proc/cohort-no-such-dir/rank-0.log");
  ASSERT_FALSE(capture.ok());
  EXPECT_NE(capture.status().message().find("/proc/cohort-no-such-dir"), std::string::npos)
      << capture.status().message();
}

// A clock the tests move by hand.
struct ManualClock {
  int64_t ms = 1'000'000;
  std::function<int64_t()> fn() {
    return [this] { return ms; };
  }
};

std::string read_all_files(const std::string& dir, const std::string& name, const LogSelection& selection,
                           StatusCode* code = nullptr) {
  auto confined = ConfinedDir::open(dir, kLogDirectoryMode);
  EXPECT_TRUE(confined.ok());
  std::string out;
  Status status = read_log_files(*confined, name, selection, [&](std::string_view bytes) {
    out.append(bytes);
    return true;
  });
  if (code != nullptr) *code = status.code();
  else EXPECT_TRUE(status.ok()) << status.to_string();
  return out;
}

TEST(LogCaptureTest, TailLinesStartIgnoresTheFinalNewline) {
  EXPECT_EQ(tail_lines_start("a\nb\nc\n", 2), 2u);
  EXPECT_EQ(tail_lines_start("a\nb\nc", 1), 4u);
  EXPECT_EQ(tail_lines_start("a\nb\n", 5), 0u);
  EXPECT_EQ(tail_lines_start("a\nb\n", 0), 0u);
}

TEST(LogCaptureTest, FilesRotateAtHalfTheCapSoARankNeverHoldsMore) {
  TempDir dir;
  auto confined = ConfinedDir::open(dir.path(), kLogDirectoryMode);
  ASSERT_TRUE(confined.ok());
  LogCaptureOptions options;
  options.max_file_bytes = 40;  // 20 bytes per file
  auto capture = LogCapture::open_in(*confined, "rank-0.log", options);
  ASSERT_TRUE(capture.ok()) << capture.status().to_string();
  for (int i = 0; i < 10; ++i) (*capture)->append(fmt::format("line {:02}\n", i));  // 8 bytes each
  (*capture)->close();
  ASSERT_TRUE((*capture)->file_status().ok()) << (*capture)->file_status().to_string();
  const std::string current = testing::read_file(dir.path() + "/rank-0.log");
  const std::string rotated = testing::read_file(dir.path() + "/rank-0.log.1");
  EXPECT_LE(current.size() + rotated.size(), 40u);
  EXPECT_EQ(current, "line 08\nline 09\n");
  EXPECT_EQ(rotated, "line 06\nline 07\n");
  // Read back from disk: the rotated file first, then the current one.
  EXPECT_EQ(read_all_files(dir.path(), "rank-0.log", {}), "line 06\nline 07\nline 08\nline 09\n");
  EXPECT_EQ(read_all_files(dir.path(), "rank-0.log", {3, 0}), "line 07\nline 08\nline 09\n");
  // The ring still has everything, offsets unchanged.
  EXPECT_EQ((*capture)->size(), 80u);
}

TEST(LogCaptureTest, SinceAndTailSelectFromMemoryAndFromDisk) {
  TempDir dir;
  auto confined = ConfinedDir::open(dir.path(), kLogDirectoryMode);
  ASSERT_TRUE(confined.ok());
  ManualClock clock;
  LogCaptureOptions options;
  options.now_unix_ms = clock.fn();
  auto capture = LogCapture::open_in(*confined, "rank-1.log", options);
  ASSERT_TRUE(capture.ok()) << capture.status().to_string();
  (*capture)->append("old 1\nold 2\n");
  clock.ms += 60'000;
  const int64_t since = clock.ms - 10;
  (*capture)->append("new 1\nnew ");
  clock.ms += 300;  // same second: no new checkpoint, still after `since`
  (*capture)->append("2\nnew 3\n");

  const std::string all = "old 1\nold 2\nnew 1\nnew 2\nnew 3\n";
  auto from = [&](LogSelection selection) { return (*capture)->read_from((*capture)->start_of(selection)).data; };
  EXPECT_EQ(from({}), all);
  EXPECT_EQ(from({0, since}), "new 1\nnew 2\nnew 3\n");
  EXPECT_EQ(from({2, 0}), "new 2\nnew 3\n");
  EXPECT_EQ(from({1, since}), "new 3\n");
  EXPECT_EQ(from({0, clock.ms + 5'000}), "");
  (*capture)->close();

  EXPECT_EQ(read_all_files(dir.path(), "rank-1.log", {}), all);
  EXPECT_EQ(read_all_files(dir.path(), "rank-1.log", {0, since}), "new 1\nnew 2\nnew 3\n");
  EXPECT_EQ(read_all_files(dir.path(), "rank-1.log", {2, 0}), "new 2\nnew 3\n");
  EXPECT_EQ(read_all_files(dir.path(), "rank-1.log", {0, clock.ms + 5'000}), "");
  StatusCode code = StatusCode::kOk;
  read_all_files(dir.path(), "rank-7.log", {}, &code);
  EXPECT_EQ(code, StatusCode::kNotFound);
}

}  // namespace
}  // namespace cohort::agent
