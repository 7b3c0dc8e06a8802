#include "daemon/agent/log_capture.h"

#include <string>
#include <thread>

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

}  // namespace
}  // namespace cohort::agent
