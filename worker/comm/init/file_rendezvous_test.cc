// file:// rendezvous: ranks assigned in arrival order when none is given, group_name namespaces,
// and a file left over from an earlier job (finished or crashed) never handing its keys to a new
// one; ranks as threads through resolve_init, the join protocol with an injected clock, and ranks
// as forked processes on one file.

#include "worker/comm/init/file_rendezvous.h"

#include <algorithm>
#include <fstream>
#include <future>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "worker/comm/init/environment.h"
#include "worker/comm/init/init_options.h"
#include "worker/comm/store/file_store.h"
#include "worker/comm/store/store_test_util.h"

namespace cohort::comm {
namespace {

constexpr Duration kTestTimeout = std::chrono::seconds(20);

// file:// options with no launcher variables (a RANK in the test's environment must not leak in).
InitOptions file_options(const std::string& url, int rank = -1) {
  InitOptions options = InitOptions::from_url(url);
  options.rank = rank;
  options.timeout = kTestTimeout;
  options.node_id = "one-node";
  options.env = environment_from({});
  return options;
}

std::vector<StatusOr<Bootstrap>> resolve_all(const std::vector<InitOptions>& per_rank) {
  std::vector<std::future<StatusOr<Bootstrap>>> futures;
  for (const InitOptions& options : per_rank) {
    futures.push_back(std::async(std::launch::async, [options] { return resolve_init(options); }));
  }
  std::vector<StatusOr<Bootstrap>> results;
  for (auto& future : futures) results.push_back(future.get());
  return results;
}

// The ranks of `boots` are exactly 0..n-1, and every rank reads every other's key.
void expect_one_job(std::vector<StatusOr<Bootstrap>>& boots) {
  std::set<int> ranks;
  for (auto& boot : boots) {
    ASSERT_TRUE(boot.ok()) << boot.status().to_string();
    EXPECT_EQ(boot->world_size, static_cast<int>(boots.size()));
    ranks.insert(boot->rank);
    ASSERT_TRUE(
        boot->store->set(fmt::format("hello/{}", boot->rank), fmt::format("from {}", boot->rank)).ok());
  }
  ASSERT_EQ(ranks.size(), boots.size());
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), static_cast<int>(boots.size()) - 1);
  for (auto& boot : boots) {
    for (int peer = 0; peer < boot->world_size; ++peer) {
      EXPECT_EQ(boot->store->get(fmt::format("hello/{}", peer), kTestTimeout).value(),
                fmt::format("from {}", peer));
    }
  }
}

TEST(FileRendezvousTest, RanksAreAssignedInArrivalOrderWhenNoneIsGiven) {
  testing::TempDir dir;
  const std::string url = fmt::format("file://{}?world_size=4", dir.file("store"));
  std::vector<StatusOr<Bootstrap>> boots = resolve_all(std::vector<InitOptions>(4, file_options(url)));
  expect_one_job(boots);
  // One node id for all: local ranks are derived through the store, not from a launcher.
  for (auto& boot : boots) {
    EXPECT_EQ(boot->local_rank, boot->rank);
    EXPECT_EQ(boot->local_world_size, 4);
  }
}

TEST(FileRendezvousTest, AssignedRanksNeedTheWorldSize) {
  testing::TempDir dir;
  Status status = resolve_init(file_options(fmt::format("file://{}", dir.file("store")))).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("world size is not set"), std::string::npos) << status.message();
}

TEST(FileRendezvousTest, AFinishedJobsFileNeverHandsItsKeysToTheNextJob) {
  testing::TempDir dir;
  const std::string url = fmt::format("file://{}?world_size=2", dir.file("store"));
  {
    // Job 1 (explicit ranks, as torch users write) publishes an address, then goes away without
    // removing the file.
    std::vector<StatusOr<Bootstrap>> job1 = resolve_all({file_options(url, 0), file_options(url, 1)});
    expect_one_job(job1);
    ASSERT_TRUE(job1[0]->store->set("transport/address/0", "old job's address").ok());
  }
  // Job 2, the same ranks on the same path: a fresh namespace.
  std::vector<StatusOr<Bootstrap>> job2 = resolve_all({file_options(url, 0), file_options(url, 1)});
  for (auto& boot : job2) {
    ASSERT_TRUE(boot.ok()) << boot.status().to_string();
    EXPECT_FALSE(boot->store->check({"transport/address/0"}).value());
    EXPECT_FALSE(boot->store->check({"hello/0"}).value());
  }
  expect_one_job(job2);
  // Job 3 assigns its ranks: also fresh.
  std::vector<StatusOr<Bootstrap>> job3 = resolve_all(std::vector<InitOptions>(2, file_options(url)));
  for (auto& boot : job3) {
    ASSERT_TRUE(boot.ok()) << boot.status().to_string();
    EXPECT_FALSE(boot->store->check({"hello/0"}).value());
  }
  expect_one_job(job3);
}

// The protocol itself, with an injected clock.
struct Clocked {
  int64_t now = 1'000'000;
  FileRendezvousOptions options(const std::string& path, int rank, int world_size) {
    FileRendezvousOptions out;
    out.path = path;
    out.rank = rank;
    out.world_size = world_size;
    out.join_window = std::chrono::seconds(60);
    out.now_ms = [this] { return now; };
    return out;
  }
};

TEST(FileRendezvousTest, GenerationsAdvancePastFullAndExpiredOnes) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  auto file = std::shared_ptr<Store>(FileStore::open(path).value());
  Clocked clock;
  // A job of 2 that all joined: full.
  FileRendezvous a = join_file_rendezvous(file, clock.options(path, -1, 2)).value();
  FileRendezvous b = join_file_rendezvous(file, clock.options(path, -1, 2)).value();
  EXPECT_EQ(a.generation, 0);
  EXPECT_EQ(b.generation, 0);
  EXPECT_EQ(a.rank, 0);
  EXPECT_EQ(b.rank, 1);
  // The next process belongs to a new job.
  FileRendezvous c = join_file_rendezvous(file, clock.options(path, -1, 3)).value();
  EXPECT_EQ(c.generation, 1);
  EXPECT_EQ(c.rank, 0);
  // That job crashed with 1 of 3 joined; past the join window its generation is dead.
  clock.now += 61'000;
  FileRendezvous d = join_file_rendezvous(file, clock.options(path, 1, 2)).value();
  EXPECT_EQ(d.generation, 2);
  EXPECT_EQ(d.rank, 1);
  ASSERT_TRUE(c.store->set("key", "crashed job").ok());
  EXPECT_FALSE(d.store->check({"key"}).value());
}

TEST(FileRendezvousTest, ACrashedPartialJobWithinTheWindowIsRefusedNotJoined) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  auto file = std::shared_ptr<Store>(FileStore::open(path).value());
  Clocked clock;
  ASSERT_TRUE(join_file_rendezvous(file, clock.options(path, 0, 4)).ok());  // then it "crashed"
  clock.now += 5'000;
  // Another world size: named, with the fix.
  Status size = join_file_rendezvous(file, clock.options(path, 0, 2)).status();
  EXPECT_EQ(size.code(), StatusCode::kInvalidArgument);
  for (const char* part : {"this process says world size 2", "said 4", path.c_str(), "delete the file"})
    EXPECT_NE(size.message().find(part), std::string::npos) << part << " in " << size.message();
  // The same world size and a rank already taken: named too.
  Status rank = join_file_rendezvous(file, clock.options(path, 0, 4)).status();
  EXPECT_EQ(rank.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rank.message().find("rank 0 already joined generation 0"), std::string::npos) << rank.message();
}

TEST(FileRendezvousTest, GroupNamesShareAFileWithoutSharingKeysOrRanks) {
  testing::TempDir dir;
  const std::string base = fmt::format("file://{}?world_size=2", dir.file("store"));
  InitOptions red = file_options(base + "&group_name=red");
  InitOptions blue = file_options(base);
  blue.group_name = "blue";
  std::vector<StatusOr<Bootstrap>> boots = resolve_all({red, blue, red, blue});
  std::vector<StatusOr<Bootstrap>> reds{boots[0], boots[2]}, blues{boots[1], boots[3]};
  expect_one_job(reds);
  ASSERT_TRUE(reds[0]->store->set("only-red", "1").ok());
  EXPECT_FALSE(blues[0]->store->check({"only-red"}).value());
  expect_one_job(blues);

  InitOptions both = file_options(base + "&group_name=red");
  both.group_name = "blue";
  EXPECT_NE(resolve_init(both).status().message().find("give it once"), std::string::npos);
  Status bad = resolve_init(file_options(base + "&group_name=a/b")).status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("group_name \"a/b\""), std::string::npos) << bad.message();
  InitOptions tcp = file_options("tcp://127.0.0.1:1?rank=0&world_size=1");
  tcp.group_name = "red";
  EXPECT_NE(resolve_init(tcp).status().message().find("applies to file:// only"), std::string::npos);
}

// Processes: a file that already holds a finished job; three processes without ranks join a new
// generation, get distinct ranks and meet.
TEST(FileRendezvousTest, ProcessesWithoutRanksJoinAFreshGenerationOfALeftoverFile) {
  testing::TempDir dir;
  const std::string url = fmt::format("file://{}?world_size=3", dir.file("store"));
  {
    std::vector<StatusOr<Bootstrap>> old = resolve_all(std::vector<InitOptions>(3, file_options(url)));
    expect_one_job(old);
    ASSERT_TRUE(old[0]->store->set("stale", "yes").ok());
  }
  std::vector<std::string> failures = testing::run_children(3, [&](int child) {
    StatusOr<Bootstrap> boot = resolve_init(file_options(url));
    if (!boot.ok()) return 2;
    if (boot->store->check({"stale"}).value_or(true)) return 3;
    if (!boot->store->set(fmt::format("alive/{}", boot->rank), "1").ok()) return 4;
    for (int r = 0; r < 3; ++r) {
      if (!boot->store->get(fmt::format("alive/{}", r), kTestTimeout).ok()) return 5;
    }
    std::ofstream(dir.file(fmt::format("rank-of-{}", child))) << boot->rank;
    return 0;
  });
  EXPECT_TRUE(failures.empty()) << fmt::format("{}", fmt::join(failures, "; "));
  std::set<int> ranks;
  for (int child = 0; child < 3; ++child) {
    int rank = -1;
    std::ifstream(dir.file(fmt::format("rank-of-{}", child))) >> rank;
    ranks.insert(rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

}  // namespace
}  // namespace cohort::comm
