// Slurm node-list expansion: the forms Slurm prints (ranges, padding, several entries and bracket
// groups) and malformed lists, each rejected with the list and the position in the message.

#include "worker/comm/init/slurm_hostlist.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace cohort::comm {
namespace {

using Hosts = std::vector<std::string>;

Hosts expand(std::string_view list) {
  StatusOr<Hosts> hosts = expand_slurm_hostlist(list);
  EXPECT_TRUE(hosts.ok()) << list << ": " << hosts.status().to_string();
  return hosts.ok() ? *hosts : Hosts{};
}

TEST(SlurmHostlistTest, PlainNamesAndSingleHosts) {
  EXPECT_EQ(expand("gpu3"), Hosts{"gpu3"});
  EXPECT_EQ(expand("vm"), Hosts{"vm"});
  EXPECT_EQ(expand("a,b.example.org,c-1"), (Hosts{"a", "b.example.org", "c-1"}));
}

TEST(SlurmHostlistTest, RangesKeepTheLowEndsPaddingAndTheirOrder) {
  EXPECT_EQ(expand("node[01-04,07],gpu3"), (Hosts{"node01", "node02", "node03", "node04", "node07", "gpu3"}));
  EXPECT_EQ(expand("n[8-11]"), (Hosts{"n8", "n9", "n10", "n11"}));
  EXPECT_EQ(expand("n[098-101]"), (Hosts{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand("n[5]"), Hosts{"n5"});
  EXPECT_EQ(expand("n[3,1]"), (Hosts{"n3", "n1"}));  // Slurm keeps the order it was given
}

TEST(SlurmHostlistTest, SuffixesAndSeveralBracketGroups) {
  EXPECT_EQ(expand("n[1-2]-ib"), (Hosts{"n1-ib", "n2-ib"}));
  EXPECT_EQ(expand("rack[1-2]-n[01-02]"), (Hosts{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"}));
  EXPECT_EQ(expand("[1-2]x"), (Hosts{"1x", "2x"}));
  EXPECT_EQ(expand("a[1-2],b[3-4]c"), (Hosts{"a1", "a2", "b3c", "b4c"}));
}

// Expects INVALID_ARGUMENT whose message holds every one of `parts`.
void expect_error(std::string_view list, const std::vector<std::string>& parts) {
  StatusOr<Hosts> hosts = expand_slurm_hostlist(list);
  ASSERT_FALSE(hosts.ok()) << list << " expanded to " << hosts->size() << " hosts";
  EXPECT_EQ(hosts.status().code(), StatusCode::kInvalidArgument) << list;
  for (const std::string& part : parts) {
    EXPECT_NE(hosts.status().message().find(part), std::string::npos)
        << list << ": missing \"" << part << "\" in: " << hosts.status().message();
  }
  EXPECT_NE(hosts.status().message().find("node[01-04,07],gpu3"), std::string::npos)
      << "no example of the syntax in: " << hosts.status().message();
}

TEST(SlurmHostlistTest, MalformedListsSayWhatAndWhere) {
  expect_error("", {"empty"});
  expect_error("a,,b", {"\"a,,b\"", "empty host name at character 3"});
  expect_error("a,", {"empty host name at character 3"});
  expect_error("node[01-04", {"'[' is never closed at character 5"});
  expect_error("node01-04]", {"']' without '['"});
  expect_error("n[1-[2]]", {"nested '['"});
  expect_error("n[]", {"empty number in [...]"});
  expect_error("n[1,,2]", {"empty number in [...] at character 5"});
  expect_error("n[a-b]", {"\"a-b\" is not a number or lo-hi range"});
  expect_error("n[1-]", {"\"1-\" is not a number"});
  expect_error("n[1-2-3]", {"\"1-2-3\" is not a number"});
  expect_error("n[-3]", {"\"-3\" is not a number"});
  expect_error("n[04-01]", {"range \"04-01\" runs backwards"});
  expect_error("node 1", {"unexpected character \" \" at character 5"});
  expect_error("n[1-9999999999999999999]", {"is not a number or lo-hi range of up to 18 digits"});
}

TEST(SlurmHostlistTest, HugeListsStopAtTheLimitInsteadOfExhaustingMemory) {
  expect_error("n[0-99999999999]", {"more than 1048576 hosts (kMaxSlurmHostlistHosts)"});
  StatusOr<Hosts> small = expand_slurm_hostlist("n[1-3],m[1-2]", 4);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("more than 4 hosts"), std::string::npos)
      << small.status().message();
  EXPECT_FALSE(expand_slurm_hostlist("a[1-2]b[1-3]", 5).ok());
  EXPECT_FALSE(expand_slurm_hostlist("a,b,c", 2).ok());
  EXPECT_EQ(expand_slurm_hostlist("a[1-2]b[1-3]", 6).value().size(), 6u);
}

}  // namespace
}  // namespace cohort::comm
