// FileStore beyond the common contract: several instances on one file, bad paths, and logs left
// damaged by a writer that died.

#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "worker/comm/store/file_store.h"
#include "worker/comm/store/store_test_util.h"

namespace cohort::comm {
namespace {

constexpr Duration kShortTimeout = std::chrono::milliseconds(200);

void append_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out << bytes;
}

TEST(FileStoreTest, InstancesOnOneFileShareKeys) {
  testing::TempDir dir;
  FileStore writer(dir.file("store"));
  FileStore reader(dir.file("store"));
  ASSERT_TRUE(writer.set("k", "v").ok());
  EXPECT_EQ(reader.get("k", kShortTimeout).value(), "v");
  EXPECT_EQ(reader.add("n", 2).value(), 2);
  EXPECT_EQ(writer.add("n", 3).value(), 5);
  EXPECT_TRUE(reader.delete_key("k").value());
  EXPECT_FALSE(writer.check({"k"}).value());
  EXPECT_EQ(writer.num_keys().value(), 1);
}

TEST(FileStoreTest, OpenFailsOnAMissingDirectoryNamingThePath) {
  const std::string path = "/nonexistent-cohort-dir/store";
  StatusOr<std::unique_ptr<FileStore>> store = FileStore::open(path);
  EXPECT_EQ(store.status().code(), StatusCode::kNotFound) << store.status().to_string();
  EXPECT_NE(store.status().message().find(path), std::string::npos) << store.status().message();
}

TEST(FileStoreTest, ATornRecordAtTheEndIsSkippedThenCutOff) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  ASSERT_TRUE(FileStore(path).set("before", "1").ok());
  // A set record whose writer died after 3 bytes: kind, then part of the key length.
  append_bytes(path, std::string("\x01\x05\x00", 3));
  FileStore store(path);
  EXPECT_EQ(store.get("before", kShortTimeout).value(), "1");
  EXPECT_EQ(store.num_keys().value(), 1);
  // The next writer truncates the torn bytes before appending, so the log stays readable.
  ASSERT_TRUE(store.set("after", "2").ok());
  FileStore fresh(path);
  EXPECT_EQ(fresh.get("after", kShortTimeout).value(), "2");
  EXPECT_EQ(fresh.num_keys().value(), 2);
}

TEST(FileStoreTest, GarbageInTheFileIsDataLossNamingIt) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  append_bytes(path, std::string("\x7f\x01\x00\x00\x00k", 6));
  StatusOr<int64_t> count = FileStore(path).num_keys();
  EXPECT_EQ(count.status().code(), StatusCode::kDataLoss) << count.status().to_string();
  EXPECT_NE(count.status().message().find(path), std::string::npos) << count.status().message();
}

TEST(FileStoreTest, AReplacedFileIsReadAfresh) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  FileStore store(path);
  ASSERT_TRUE(store.set("old", "1").ok());
  ASSERT_TRUE(store.set("older", "1").ok());
  ASSERT_EQ(std::remove(path.c_str()), 0);
  ASSERT_TRUE(FileStore(path).set("new", "2").ok());
  EXPECT_FALSE(store.check({"old"}).value());
  EXPECT_EQ(store.get("new", kShortTimeout).value(), "2");
  EXPECT_EQ(store.num_keys().value(), 1);
}

}  // namespace
}  // namespace cohort::comm
