// The building blocks under the stores: byte encoding, the shared table semantics, wait errors.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/comm/store/key_value_table.h"
#include "worker/comm/store/store_wait.h"
#include "worker/comm/store/wire_format.h"

namespace cohort::comm {
namespace {

TEST(WireFormatTest, RoundTripsEveryField) {
  const std::vector<std::string> list{"a", "", std::string("\0b", 2)};
  const std::string bytes = WireWriter().u8(7).u32(0xdeadbeef).i64(-42).str("key").strs(list).take();
  WireReader reader(bytes);
  uint8_t small = 0;
  uint32_t medium = 0;
  int64_t large = 0;
  std::string text;
  std::vector<std::string> texts;
  ASSERT_TRUE(reader.u8(&small) && reader.u32(&medium) && reader.i64(&large) && reader.str(&text) &&
              reader.strs(&texts));
  EXPECT_EQ(small, 7);
  EXPECT_EQ(medium, 0xdeadbeefu);
  EXPECT_EQ(large, -42);
  EXPECT_EQ(text, "key");
  EXPECT_EQ(texts, list);
  EXPECT_TRUE(reader.at_end());
}

TEST(WireFormatTest, IsLittleEndian) {
  EXPECT_EQ(WireWriter().u32(0x01020304).take(), std::string("\x04\x03\x02\x01", 4));
}

TEST(WireFormatTest, ATruncatedStringReadsNothing) {
  const std::string bytes = WireWriter().str("hello").take();
  WireReader reader(std::string_view(bytes).substr(0, bytes.size() - 1));
  std::string text = "unchanged";
  EXPECT_FALSE(reader.str(&text));
  EXPECT_EQ(text, "unchanged");
  EXPECT_EQ(reader.position(), 0u);
}

TEST(KeyValueTableTest, AddRejectsNonIntegersAndOverflow) {
  KeyValueTable table;
  table.set("text", "12abc");
  EXPECT_EQ(table.add("text", 1).status().code(), StatusCode::kInvalidArgument);
  table.set("spaced", " 1");
  EXPECT_EQ(table.add("spaced", 1).status().code(), StatusCode::kInvalidArgument);
  table.set("big", std::to_string(std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(table.add("big", 1).status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*table.find("big"), std::to_string(std::numeric_limits<int64_t>::max()));
}

TEST(KeyValueTableTest, CompareSetReportsWhetherItSwapped) {
  KeyValueTable table;
  bool swapped = true;
  EXPECT_EQ(table.compare_set("k", "x", "y", &swapped), "");
  EXPECT_FALSE(swapped);
  EXPECT_EQ(table.compare_set("k", "", "y", &swapped), "y");
  EXPECT_TRUE(swapped);
  EXPECT_EQ(table.compare_set("k", "x", "z", &swapped), "y");
  EXPECT_FALSE(swapped);
}

TEST(KeyValueTableTest, MissingKeepsTheGivenOrder) {
  KeyValueTable table;
  table.set("b", "1");
  EXPECT_EQ(table.missing({"c", "b", "a"}), (std::vector<std::string>{"c", "a"}));
  EXPECT_TRUE(table.contains_all({"b"}));
  EXPECT_FALSE(table.contains_all({"b", "a"}));
}

TEST(StoreWaitTest, TimeoutErrorNamesStoreKeysAndTime) {
  Status error =
      keys_timeout_error("file store /tmp/x", {"rank/1", "rank/3"}, 4, std::chrono::milliseconds(1500));
  EXPECT_EQ(error.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(error.message().find("file store /tmp/x"), std::string::npos) << error.message();
  EXPECT_NE(error.message().find("[\"rank/1\", \"rank/3\"]"), std::string::npos) << error.message();
  EXPECT_NE(error.message().find("2 of 4 keys missing"), std::string::npos) << error.message();
  EXPECT_NE(error.message().find("1.5 s"), std::string::npos) << error.message();
}

TEST(StoreWaitTest, LongKeyListsAreCut) {
  std::vector<std::string> keys;
  for (int i = 0; i < 100; ++i) keys.push_back("k" + std::to_string(i));
  const std::string text = format_keys(keys);
  EXPECT_NE(text.find("and 92 more"), std::string::npos) << text;
  EXPECT_EQ(text.find("k50"), std::string::npos) << text;
}

TEST(StoreWaitTest, HugeTimeoutsAreClamped) {
  EXPECT_EQ(clamp_store_timeout(Duration::max()), kMaxStoreTimeout);
  EXPECT_EQ(clamp_store_timeout(Duration(-5)), Duration(0));
  EXPECT_FALSE(store_deadline(Duration::max()).expired());
}

}  // namespace
}  // namespace cohort::comm
