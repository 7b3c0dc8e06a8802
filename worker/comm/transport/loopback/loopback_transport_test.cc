#include "worker/comm/transport/loopback/loopback_transport.h"

#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/testing/rank_threads.h"

namespace cohort::comm {
namespace {

using std::chrono::milliseconds;

TEST(LoopbackTransportTest, SendCompletesOnlyWhenMatched) {
  auto fabric = std::make_shared<LoopbackFabric>(2);
  auto t0 = fabric->transport(0);
  auto t1 = fabric->transport(1);
  int value = 42, got = 0;
  auto send = t0->isend(1, 7, &value, sizeof(value));
  EXPECT_FALSE(send->is_completed());
  EXPECT_EQ(send->wait(milliseconds(20)).code(), StatusCode::kDeadlineExceeded);
  auto recv = t1->irecv(0, 7, &got, sizeof(got));
  ASSERT_TRUE(recv->wait(milliseconds(1000)).ok());
  ASSERT_TRUE(send->wait(milliseconds(1000)).ok());
  EXPECT_EQ(got, 42);
  EXPECT_EQ(recv->received_bytes(), sizeof(int));
}

TEST(LoopbackTransportTest, MatchesFifoPerTagAndSeparatesTags) {
  auto fabric = std::make_shared<LoopbackFabric>(2);
  auto t0 = fabric->transport(0);
  auto t1 = fabric->transport(1);
  int a = 1, b = 2, c = 3;
  auto s1 = t0->isend(1, 5, &a, 4);
  auto s2 = t0->isend(1, 5, &b, 4);
  auto s3 = t0->isend(1, 6, &c, 4);
  int r1 = 0, r2 = 0, r3 = 0;
  auto q3 = t1->irecv(0, 6, &r3, 4);
  auto q1 = t1->irecv(0, 5, &r1, 4);
  auto q2 = t1->irecv(0, 5, &r2, 4);
  for (auto& w : {q1, q2, q3, s1, s2, s3}) ASSERT_TRUE(w->wait(milliseconds(1000)).ok());
  EXPECT_EQ(r1, 1);
  EXPECT_EQ(r2, 2);
  EXPECT_EQ(r3, 3);
}

TEST(LoopbackTransportTest, TruncationNamesBothSizes) {
  auto fabric = std::make_shared<LoopbackFabric>(2);
  auto t0 = fabric->transport(0);
  auto t1 = fabric->transport(1);
  char big[16] = {}, small[8];
  auto s = t0->isend(1, 1, big, sizeof(big));
  auto r = t1->irecv(0, 1, small, sizeof(small));
  Status status = r->wait(milliseconds(1000));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("16 bytes"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("8-byte"), std::string::npos) << status.message();
}

TEST(LoopbackTransportTest, FailedRankFailsPendingAndLaterTransfers) {
  auto fabric = std::make_shared<LoopbackFabric>(3);
  auto t0 = fabric->transport(0);
  int buf = 0;
  auto pending = t0->irecv(2, 1, &buf, 4);
  fabric->fail_rank(2, unavailable_error("SIGKILL in test"));
  Status status = pending->wait(milliseconds(1000));
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("rank 2"), std::string::npos);
  EXPECT_NE(status.message().find("SIGKILL in test"), std::string::npos);
  EXPECT_EQ(t0->isend(2, 1, &buf, 4)->wait(milliseconds(1000)).code(), StatusCode::kUnavailable);
  EXPECT_FALSE(t0->peer_status(2).ok());
  EXPECT_TRUE(t0->peer_status(1).ok());
}

TEST(LoopbackTransportTest, CancelReleasesAQueuedTransfer) {
  auto fabric = std::make_shared<LoopbackFabric>(2);
  auto t0 = fabric->transport(0);
  auto t1 = fabric->transport(1);
  int first = 0, second = 0, value = 9;
  auto cancelled = t1->irecv(0, 3, &first, 4);
  cancelled->cancel(cancelled_error("test gave up"));
  EXPECT_EQ(cancelled->wait(milliseconds(100)).code(), StatusCode::kCancelled);
  auto recv = t1->irecv(0, 3, &second, 4);
  auto send = t0->isend(1, 3, &value, 4);
  ASSERT_TRUE(recv->wait(milliseconds(1000)).ok());
  EXPECT_EQ(first, 0);  // the cancelled buffer was never written
  EXPECT_EQ(second, 9);
}

TEST(LoopbackTransportTest, InvalidPeerIsAnErrorAtTheCall) {
  auto fabric = std::make_shared<LoopbackFabric>(2);
  auto t0 = fabric->transport(0);
  int v = 0;
  EXPECT_EQ(t0->isend(5, 1, &v, 4)->wait(milliseconds(10)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t0->irecv(0, 1, &v, 4)->wait(milliseconds(10)).code(), StatusCode::kInvalidArgument);
}

TEST(CollectiveContextTest, TimeoutNamesOpPeerAndTimeAndReleasesBuffers) {
  auto fabric = std::make_shared<LoopbackFabric>(2);
  auto t0 = fabric->transport(0);
  std::vector<int> ranks = {0, 1};
  int buf = 0;
  Status status;
  {
    CollectiveContext ctx(t0.get(), &ranks, 0, collective_tag_base(0, 1), Deadline::after(milliseconds(50)), "allreduce");
    status = ctx.recv(1, 3, &buf, sizeof(buf));
  }
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("allreduce"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("receive from rank 1"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("50 ms"), std::string::npos) << status.message();
  // The timed-out receive was cancelled: a late send from rank 1 finds no receiver.
  auto t1 = fabric->transport(1);
  int late = 5;
  auto send = t1->isend(0, collective_tag_base(0, 1) | 3, &late, 4);
  EXPECT_EQ(send->wait(milliseconds(20)).code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(buf, 0);
  send->cancel(cancelled_error("done"));
}

TEST(CollectiveContextTest, RingOfSendrecvAcrossThreads) {
  for (int size : {1, 2, 3, 5, 8}) {
    auto fabric = std::make_shared<LoopbackFabric>(size);
    std::vector<int> ranks(size);
    std::iota(ranks.begin(), ranks.end(), 0);
    auto statuses = testing::run_ranks(size, [&](int rank) -> Status {
      if (size == 1) return ok_status();
      auto transport = fabric->transport(rank);
      CollectiveContext ctx(transport.get(), &ranks, rank, collective_tag_base(0, 0), Deadline::after(std::chrono::seconds(10)), "ring");
      int mine = rank * 10, got = -1;
      COHORT_RETURN_IF_ERROR(ctx.sendrecv((rank + 1) % size, &mine, 4, (rank + size - 1) % size, &got, 4, 0));
      if (got != ((rank + size - 1) % size) * 10) return internal_error("rank {} got {}", rank, got);
      return ok_status();
    });
    EXPECT_EQ(testing::failures(statuses), "") << "size " << size;
  }
}

}  // namespace
}  // namespace cohort::comm
