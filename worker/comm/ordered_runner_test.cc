#include "worker/comm/ordered_runner.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/work.h"

namespace cohort::comm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::shared_ptr<CompletionWork> new_work() { return std::make_shared<CompletionWork>(); }

TEST(OrderedRunnerTest, AnIdleRunnerRunsInlineAndHoldsTheTokenUntilTheEnd) {
  OrderedRunner runner;
  ASSERT_TRUE(runner.try_run_inline());
  EXPECT_FALSE(runner.try_run_inline()) << "the token is held";
  runner.end_inline();
  EXPECT_TRUE(runner.try_run_inline());
  runner.end_inline();
}

TEST(OrderedRunnerTest, QueuedBodiesRunInIssueOrderAndCompleteTheirWork) {
  OrderedRunner runner;
  std::mutex mutex;
  std::vector<int> order;
  std::vector<std::shared_ptr<CompletionWork>> works;
  for (int i = 0; i < 20; ++i) {
    works.push_back(new_work());
    ASSERT_TRUE(runner.enqueue(
        [&, i]() -> Status {
          std::lock_guard<std::mutex> lock(mutex);
          order.push_back(i);
          return i == 7 ? internal_error("body {} failed", i) : ok_status();
        },
        works.back()).ok());
  }
  for (int i = 0; i < 20; ++i) {
    Status status = works[i]->wait(seconds(10));
    if (i == 7) {
      EXPECT_EQ(status.code(), StatusCode::kInternal) << status.to_string();
    } else {
      EXPECT_TRUE(status.ok()) << i << ": " << status.to_string();
    }
  }
  std::vector<int> expected;
  for (int i = 0; i < 20; ++i) expected.push_back(i);
  EXPECT_EQ(order, expected);
  // Everything ran and the token is back: a blocking call runs inline again.
  EXPECT_TRUE(runner.try_run_inline());
  runner.end_inline();
}

TEST(OrderedRunnerTest, NothingRunsInlineWhileWorkIsQueued) {
  OrderedRunner runner;
  std::atomic<bool> release{false};
  auto first = new_work(), second = new_work();
  ASSERT_TRUE(runner.enqueue(
      [&]() -> Status {
        while (!release.load()) std::this_thread::sleep_for(milliseconds(1));
        return ok_status();
      },
      first).ok());
  ASSERT_TRUE(runner.enqueue([] { return ok_status(); }, second).ok());
  // The first holds the token or the second is queued (or both) until both are done.
  const bool took = runner.try_run_inline();
  EXPECT_FALSE(took);
  if (took) runner.end_inline();
  release = true;
  EXPECT_TRUE(second->wait(seconds(10)).ok());
  EXPECT_TRUE(first->is_completed()) << "the second completed before the first";
}

TEST(OrderedRunnerTest, AQueuedBodyWaitsForTheInlineHolder) {
  OrderedRunner runner;
  ASSERT_TRUE(runner.try_run_inline());
  std::atomic<bool> inline_done{false};
  std::atomic<bool> ran_during_inline{false};
  auto work = new_work();
  ASSERT_TRUE(runner.enqueue(
      [&]() -> Status {
        ran_during_inline = !inline_done.load();
        return ok_status();
      },
      work).ok());
  EXPECT_FALSE(work->wait(milliseconds(50)).ok()) << "ran while the inline call held the token";
  inline_done = true;
  runner.end_inline();
  EXPECT_TRUE(work->wait(seconds(10)).ok());
  EXPECT_FALSE(ran_during_inline.load());
}

// The race end_inline() leaves open (a blocking call that did not see the executor start gives the
// token back without notifying it), forced: the executor must find the token by itself.
TEST(OrderedRunnerTest, AnExecutorThatMissedTheNotificationStillGetsTheToken) {
  OrderedRunner runner;
  runner.return_token_plainly_for_testing();
  ASSERT_TRUE(runner.try_run_inline());
  auto work = new_work();
  ASSERT_TRUE(runner.enqueue([] { return ok_status(); }, work).ok());
  std::this_thread::sleep_for(milliseconds(20));  // the executor is waiting for the token by now
  runner.end_inline();                             // no notification
  EXPECT_TRUE(work->wait(seconds(10)).ok()) << "the executor never looked at the token again";
}

TEST(OrderedRunnerTest, TheStartHookRunsOnTheExecutorBeforeItsFirstBody) {
  std::thread::id hook_thread, body_thread;
  std::atomic<int> step{0};
  int hook_step = -1, body_step = -1;
  OrderedRunner runner([&] {
    hook_thread = std::this_thread::get_id();
    hook_step = step++;
  });
  auto work = new_work();
  ASSERT_TRUE(runner.enqueue(
      [&]() -> Status {
        body_thread = std::this_thread::get_id();
        body_step = step++;
        return ok_status();
      },
      work).ok());
  ASSERT_TRUE(work->wait(seconds(10)).ok());
  EXPECT_EQ(hook_thread, body_thread);
  EXPECT_NE(hook_thread, std::this_thread::get_id());
  EXPECT_EQ(hook_step, 0);
  EXPECT_EQ(body_step, 1);
}

TEST(OrderedRunnerTest, StopRunsWhatIsQueuedAndRefusesMore) {
  OrderedRunner runner;
  std::vector<std::shared_ptr<CompletionWork>> works;
  std::atomic<int> ran{0};
  for (int i = 0; i < 5; ++i) {
    works.push_back(new_work());
    ASSERT_TRUE(runner.enqueue(
        [&]() -> Status {
          std::this_thread::sleep_for(milliseconds(2));
          ++ran;
          return ok_status();
        },
        works.back()).ok());
  }
  runner.stop();
  EXPECT_EQ(ran.load(), 5);
  for (const auto& work : works) EXPECT_TRUE(work->is_completed());
  auto late = new_work();
  bool late_ran = false;
  Status refused = runner.enqueue([&] { late_ran = true; return ok_status(); }, late);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  EXPECT_FALSE(late->is_completed()) << "the caller completes a refused work";
  EXPECT_FALSE(late_ran);
  runner.stop();  // idempotent
}

}  // namespace
}  // namespace cohort::comm
