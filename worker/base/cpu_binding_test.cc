#include "worker/base/cpu_binding.h"

#include <sched.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace cohort {
namespace {

TEST(CpuBindingTest, ParsesTheTwoModesAndNamesABadValue) {
  EXPECT_EQ(*parse_cpu_bind("none"), CpuBind::kNone);
  EXPECT_EQ(*parse_cpu_bind("core"), CpuBind::kCore);
  EXPECT_EQ(*parse_cpu_bind("auto"), CpuBind::kAuto);
  auto bad = parse_cpu_bind("socket");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'socket'"), std::string::npos) << bad.status().message();
}

TEST(CpuBindingTest, SharesAreEqualContiguousAndCoverEveryCpu) {
  const std::vector<int> allowed = {0, 1, 2, 3, 4, 6, 7};  // 7 CPUs, 5 missing
  EXPECT_EQ(*cpu_share(allowed, 0, 2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(*cpu_share(allowed, 1, 2), (std::vector<int>{4, 6, 7}));
  std::vector<int> all;
  for (int rank = 0; rank < 3; ++rank) {
    auto share = cpu_share(allowed, rank, 3);
    ASSERT_TRUE(share.ok());
    EXPECT_GE(share->size(), 2u);
    all.insert(all.end(), share->begin(), share->end());
  }
  EXPECT_EQ(all, allowed);
  EXPECT_EQ(*cpu_share({5, 9}, 1, 2), (std::vector<int>{9}));
}

TEST(CpuBindingTest, MoreRanksThanCpusIsRefusedNamingBothCounts) {
  auto share = cpu_share({0, 1}, 0, 4);
  ASSERT_FALSE(share.ok());
  EXPECT_EQ(share.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(share.status().message().find("4 local ranks"), std::string::npos) << share.status().message();
  EXPECT_NE(share.status().message().find("2 CPU(s) (0-1)"), std::string::npos) << share.status().message();
  EXPECT_EQ(cpu_share({0, 1}, 2, 2).status().code(), StatusCode::kInvalidArgument);
}

TEST(CpuBindingTest, PlansEveryRankBeforeAnyBinds) {
  auto allowed = allowed_cpus();
  ASSERT_TRUE(allowed.ok());
  const int cpus = static_cast<int>(allowed->size());
  auto none = plan_local_ranks(CpuBind::kNone, 3);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, std::vector<std::vector<int>>(3));
  auto core = plan_local_ranks(CpuBind::kCore, cpus);
  ASSERT_TRUE(core.ok()) << core.status().to_string();
  std::vector<int> all;
  for (const auto& share : *core) all.insert(all.end(), share.begin(), share.end());
  EXPECT_EQ(all, *allowed);
  EXPECT_EQ(*plan_local_ranks(CpuBind::kAuto, cpus + 1), std::vector<std::vector<int>>(cpus + 1));
  EXPECT_EQ(plan_local_ranks(CpuBind::kCore, cpus + 1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(bind_to_cpus({}).ok());
}

TEST(CpuBindingTest, FormatsRangesAsTasksetDoes) {
  EXPECT_EQ(format_cpu_list({}), "");
  EXPECT_EQ(format_cpu_list({3}), "3");
  EXPECT_EQ(format_cpu_list({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(format_cpu_list({0, 2, 5, 6}), "0,2,5-6");
}

// Binding applies to the calling thread and what it starts later; run on a thread of its own so
// the test process keeps its CPUs.
TEST(CpuBindingTest, BindsTheCallingThreadToItsShare) {
  auto allowed = allowed_cpus();
  ASSERT_TRUE(allowed.ok());
  ASSERT_FALSE(allowed->empty());
  const int size = static_cast<int>(allowed->size());
  const int rank = size - 1;
  std::vector<int> bound, seen_by_child;
  Status status;
  std::thread([&] {
    auto result = bind_local_rank(CpuBind::kCore, rank, size);
    if (!result.ok()) {
      status = result.status();
      return;
    }
    bound = *result;
    std::thread([&] { seen_by_child = *allowed_cpus(); }).join();
  }).join();
  ASSERT_TRUE(status.ok()) << status.to_string();
  EXPECT_EQ(bound, (std::vector<int>{allowed->back()}));
  EXPECT_EQ(seen_by_child, bound);  // inherited by threads started after
  EXPECT_EQ(*allowed_cpus(), *allowed);  // this thread is untouched
  EXPECT_TRUE(bind_local_rank(CpuBind::kNone, 0, 1)->empty());
  // auto with more ranks than CPUs binds nothing (core refuses).
  EXPECT_TRUE(bind_local_rank(CpuBind::kAuto, 0, size + 1)->empty());
  EXPECT_EQ(bind_local_rank(CpuBind::kCore, 0, size + 1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(*allowed_cpus(), *allowed);
}

}  // namespace
}  // namespace cohort

namespace cohort {
namespace {

// Sets OMP_NUM_THREADS for one test and puts the previous value back.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(const char* value) {
    if (const char* old = std::getenv("OMP_NUM_THREADS"); old != nullptr) previous_ = old;
    if (value != nullptr) {
      setenv("OMP_NUM_THREADS", value, 1);
    } else {
      unsetenv("OMP_NUM_THREADS");
    }
  }
  ~ScopedOmpThreads() {
    if (previous_) {
      setenv("OMP_NUM_THREADS", previous_->c_str(), 1);
    } else {
      unsetenv("OMP_NUM_THREADS");
    }
  }

 private:
  std::optional<std::string> previous_;
};

TEST(CpuThreadsForRankTest, OmpNumThreadsWinsWhenItHoldsACount) {
  // As libgomp reads them: spaces around it, and the first level of a nested list.
  for (auto [text, count] : {std::pair{"3", 3}, std::pair{" 4", 4}, std::pair{"4 ", 4}, std::pair{"6,2", 6}}) {
    ScopedOmpThreads omp(text);
    std::string ignored;
    EXPECT_EQ(cpu_threads_for_rank(2, &ignored), count) << "'" << text << "'";
    EXPECT_EQ(ignored, "") << "'" << text << "'";
  }
}

TEST(CpuThreadsForRankTest, OtherwiseTheAllowedCpusAreShared) {
  ScopedOmpThreads omp(nullptr);
  const int cpus = static_cast<int>(allowed_cpus()->size());
  EXPECT_EQ(cpu_threads_for_rank(1), cpus);
  EXPECT_EQ(cpu_threads_for_rank(cpus + 5), 1) << "at least one thread";
  if (cpus >= 2) {
    EXPECT_EQ(cpu_threads_for_rank(2), cpus / 2);
  }
}

TEST(CpuThreadsForRankTest, AMalformedValueIsIgnoredAndReported) {
  for (const char* bad : {"0", "-2", "four", "2x", ",4", "99999999999999999999", "2000000"}) {
    ScopedOmpThreads omp(bad);
    std::string ignored;
    EXPECT_EQ(cpu_threads_for_rank(1, &ignored), static_cast<int>(allowed_cpus()->size())) << bad;
    EXPECT_EQ(ignored, bad);
  }
}

}  // namespace
}  // namespace cohort
