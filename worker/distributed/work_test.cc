#include "worker/distributed/work.h"

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

namespace cohort::distributed {
namespace {

using namespace std::chrono_literals;

TEST(WorkTest, PendingUntilEveryTransferCompletesThenFinishesOnce) {
  auto a = std::make_shared<comm::CompletionWork>(), b = std::make_shared<comm::CompletionWork>();
  std::atomic<int> finished{0};
  Work work("all_gather", {a, b}, [&](const Status& s) {
    ++finished;
    return s;
  });
  EXPECT_FALSE(work.is_completed());
  a->complete(ok_status());
  EXPECT_FALSE(work.is_completed());
  EXPECT_EQ(work.exception(), nullptr);
  try {
    work.wait(20ms);
    ADD_FAILURE() << "wait(20ms) on a pending work returned";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather: not finished within the wait timeout of 20 ms"),
              std::string::npos)
        << e.what();
  }
  std::thread completer([&] {
    std::this_thread::sleep_for(30ms);
    b->complete(ok_status());
  });
  EXPECT_TRUE(work.wait());
  completer.join();
  EXPECT_TRUE(work.is_completed());
  EXPECT_TRUE(work.is_success());
  EXPECT_EQ(finished.load(), 1);
  EXPECT_TRUE(work.wait());
  EXPECT_EQ(finished.load(), 1);
}

TEST(WorkTest, AFailedTransferIsTheExceptionAndWaitThrowsIt) {
  auto a = std::make_shared<comm::CompletionWork>();
  bool copied = false;
  Work work("broadcast from rank 2", {a}, [&](const Status& s) {
    copied = s.ok();
    return s;
  });
  a->complete(deadline_exceeded_error("peer 2 silent"));
  EXPECT_TRUE(work.is_completed());
  EXPECT_FALSE(work.is_success());
  EXPECT_FALSE(copied);
  ASSERT_NE(work.exception(), nullptr);
  EXPECT_EQ(work.status().code(), StatusCode::kDeadlineExceeded);
  try {
    work.wait();
    ADD_FAILURE() << "wait on a failed work returned";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("broadcast from rank 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("peer 2 silent"), std::string::npos) << e.what();
  }
}

TEST(WorkTest, FinishMayReplaceTheResultAndItsExceptionFailsTheWork) {
  auto a = std::make_shared<comm::CompletionWork>();
  a->complete(ok_status());
  Work mismatch("recv", {a},
                [](const Status&) { return invalid_argument_error("sent Float [4], posted Double [5]"); });
  EXPECT_EQ(mismatch.status().code(), StatusCode::kOk);  // not settled yet
  EXPECT_FALSE(mismatch.is_success());
  EXPECT_EQ(mismatch.status().code(), StatusCode::kInvalidArgument);
  Work thrower("x", {a}, [](const Status&) -> Status { throw std::runtime_error("boom"); });
  EXPECT_THROW(thrower.wait(), std::runtime_error);
}

TEST(WorkTest, DestructorWaitsForTransfersStillInFlight) {
  auto a = std::make_shared<comm::CompletionWork>();
  std::thread completer([&] {
    std::this_thread::sleep_for(50ms);
    a->complete(ok_status());
  });
  auto start = std::chrono::steady_clock::now();
  { Work work("isend", {a}); }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 40ms);
  EXPECT_TRUE(a->is_completed());
  completer.join();
}

TEST(WorkTest, ThenRunsAfterTheFirstWorkAndAsCommWorkReportsItsStatus) {
  auto a = std::make_shared<comm::CompletionWork>();
  auto first = std::make_shared<Work>("all_reduce", std::vector<std::shared_ptr<comm::Work>>{a});
  bool decompressed = false;
  auto second = then(first, "fp16_compress_hook", [&](const Status& s) {
    decompressed = s.ok();
    return s;
  });
  std::shared_ptr<comm::Work> seen = as_comm_work(second);
  EXPECT_FALSE(seen->is_completed());
  EXPECT_EQ(seen->wait(10ms).code(), StatusCode::kDeadlineExceeded);
  a->complete(ok_status());
  EXPECT_TRUE(seen->wait().ok());
  EXPECT_TRUE(decompressed);

  auto b = std::make_shared<comm::CompletionWork>();
  b->complete(unavailable_error("rank 1 died"));
  auto failed =
      as_comm_work(then(std::make_shared<Work>("x", std::vector<std::shared_ptr<comm::Work>>{b}), "y", {}));
  EXPECT_EQ(failed->wait().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace cohort::distributed
