// The entry points' contract beyond the results: argument errors, forced algorithms that do not
// implement a collective, trivial cases that must not send anything, and a rank that never
// arrives making the others fail with DEADLINE_EXCEEDED instead of hanging.

#include <functional>
#include <numeric>

#include <gtest/gtest.h>

#include "worker/comm/algorithms/algorithm.h"
#include "worker/comm/algorithms/collective_test_harness.h"
#include "worker/comm/algorithms/collectives.h"

namespace cohort::comm {
namespace {

using std::chrono::milliseconds;

// One call of each entry point on every rank, with `n` bytes (or 4-byte elements) per rank and
// root 1 % size, into buffers big enough for any rank count used here.
struct EntryPoint {
  Collective collective;
  std::function<Status(CollectiveContext&, size_t n, Algorithm)> call;
};

std::vector<EntryPoint> entry_points() {
  auto sizes = [](const CollectiveContext& ctx, size_t n) { return std::vector<size_t>(ctx.size(), n); };
  auto buffer = [](size_t bytes) { return std::vector<uint8_t>(std::max<size_t>(bytes, 1)); };
  auto root = [](const CollectiveContext& ctx) { return 1 % ctx.size(); };
  return {
      {Collective::kAllreduce,
       [=](CollectiveContext& ctx, size_t n, Algorithm a) {
         auto buf = buffer(4 * n);
         return run_allreduce(ctx, buf.data(), n, DataType::kInt32, ReduceOp::kSum, a);
       }},
      {Collective::kReduce,
       [=](CollectiveContext& ctx, size_t n, Algorithm a) {
         auto buf = buffer(4 * n);
         return run_reduce(ctx, buf.data(), n, DataType::kInt32, ReduceOp::kMax, root(ctx), a);
       }},
      {Collective::kBroadcast,
       [=](CollectiveContext& ctx, size_t n, Algorithm a) {
         auto buf = buffer(n);
         return run_broadcast(ctx, buf.data(), n, root(ctx), a);
       }},
      {Collective::kAllgather,
       [=](CollectiveContext& ctx, size_t n, Algorithm a) {
         auto send = buffer(n);
         auto recv = buffer(n * ctx.size());
         return run_allgatherv(ctx, send.data(), recv.data(), sizes(ctx, n), a);
       }},
      {Collective::kGather,
       [=](CollectiveContext& ctx, size_t n, Algorithm a) {
         auto send = buffer(n);
         auto recv = buffer(n * ctx.size());
         return run_gatherv(ctx, send.data(), recv.data(), sizes(ctx, n), root(ctx), a);
       }},
      {Collective::kScatter,
       [=](CollectiveContext& ctx, size_t n, Algorithm a) {
         auto send = buffer(n * ctx.size());
         auto recv = buffer(n);
         return run_scatterv(ctx, send.data(), recv.data(), sizes(ctx, n), root(ctx), a);
       }},
      {Collective::kReduceScatter,
       [=](CollectiveContext& ctx, size_t n, Algorithm a) {
         auto buf = buffer(4 * n * ctx.size());
         auto out = buffer(4 * n);
         return run_reduce_scatter(ctx, buf.data(), out.data(), sizes(ctx, n), DataType::kFloat32,
                                   ReduceOp::kSum, a);
       }},
      {Collective::kAlltoall,
       [=](CollectiveContext& ctx, size_t n, Algorithm a) {
         auto send = buffer(n * ctx.size());
         auto recv = buffer(n * ctx.size());
         return run_alltoallv(ctx, send.data(), sizes(ctx, n), recv.data(), sizes(ctx, n), a);
       }},
      {Collective::kBarrier, [](CollectiveContext& ctx, size_t, Algorithm) { return run_barrier(ctx); }},
  };
}

constexpr Algorithm kAllAlgorithms[] = {Algorithm::kAuto,
                                        Algorithm::kRing,
                                        Algorithm::kHalvingDoubling,
                                        Algorithm::kRecursiveDoubling,
                                        Algorithm::kBinomialTree,
                                        Algorithm::kPairwise,
                                        Algorithm::kLinear};

TEST(CollectivesTest, ForcedAlgorithmThatDoesNotImplementTheCollectiveFailsBeforeSending) {
  int checked = 0;
  for (const EntryPoint& entry : entry_points()) {
    if (entry.collective == Collective::kBarrier) continue;  // no algorithm argument
    for (Algorithm algorithm : kAllAlgorithms) {
      if (implements(entry.collective, algorithm)) continue;
      SCOPED_TRACE(fmt::format("{} forced {}", collective_name(entry.collective), algorithm_name(algorithm)));
      for (int size : {1, 3}) {
        auto run = testing::run_collective(
            size, [&](CollectiveContext& ctx) { return entry.call(ctx, 64, algorithm); });
        for (const Status& status : run.statuses) {
          EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
          EXPECT_NE(status.message().find(std::string(algorithm_name(algorithm))), std::string::npos);
          EXPECT_NE(status.message().find("available"), std::string::npos) << status.message();
        }
        EXPECT_EQ(run.transfers_posted, 0u);
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(CollectivesTest, BroadcastForcedRingNamesTheAlternatives) {
  auto run = testing::run_collective(2, [](CollectiveContext& ctx) {
    char buf[8] = {};
    return run_broadcast(ctx, buf, sizeof(buf), 0, Algorithm::kRing);
  });
  EXPECT_EQ(run.statuses[0].message(), "broadcast has no 'ring' algorithm (available: binomial, linear)");
}

TEST(CollectivesTest, ZeroBytesSendNothing) {
  for (const EntryPoint& entry : entry_points()) {
    if (entry.collective == Collective::kBarrier) continue;
    for (int size : {2, 5}) {
      SCOPED_TRACE(fmt::format("{} ranks={}", collective_name(entry.collective), size));
      auto run = testing::run_collective(
          size, [&](CollectiveContext& ctx) { return entry.call(ctx, 0, Algorithm::kAuto); });
      EXPECT_EQ(run.failures(), "");
      EXPECT_EQ(run.transfers_posted, 0u);
    }
  }
}

TEST(CollectivesTest, OneRankGroupsSendNothingAndCopyLocally) {
  for (const EntryPoint& entry : entry_points()) {
    SCOPED_TRACE(collective_name(entry.collective));
    auto run = testing::run_collective(
        1, [&](CollectiveContext& ctx) { return entry.call(ctx, 100, Algorithm::kAuto); });
    EXPECT_EQ(run.failures(), "");
    EXPECT_EQ(run.transfers_posted, 0u);
  }
  // The copies a one-rank group still makes when the output is another buffer.
  auto run = testing::run_collective(1, [](CollectiveContext& ctx) -> Status {
    std::vector<uint8_t> send = testing::pattern_bytes(0, 33);
    std::vector<uint8_t> recv(33, 0);
    COHORT_RETURN_IF_ERROR(run_allgatherv(ctx, send.data(), recv.data(), {33}));
    if (recv != send) return internal_error("allgatherv did not copy");
    std::fill(recv.begin(), recv.end(), 0);
    COHORT_RETURN_IF_ERROR(run_gatherv(ctx, send.data(), recv.data(), {33}, 0));
    if (recv != send) return internal_error("gatherv did not copy");
    std::fill(recv.begin(), recv.end(), 0);
    COHORT_RETURN_IF_ERROR(run_scatterv(ctx, send.data(), recv.data(), {33}, 0));
    if (recv != send) return internal_error("scatterv did not copy");
    std::fill(recv.begin(), recv.end(), 0);
    COHORT_RETURN_IF_ERROR(run_alltoallv(ctx, send.data(), {33}, recv.data(), {33}));
    if (recv != send) return internal_error("alltoallv did not copy");
    std::vector<int32_t> in = {1, 2, 3}, out(3, 0);
    COHORT_RETURN_IF_ERROR(
        run_reduce_scatter(ctx, in.data(), out.data(), {3}, DataType::kInt32, ReduceOp::kSum));
    if (out != in) return internal_error("reduce_scatter did not copy");
    return ok_status();
  });
  EXPECT_EQ(run.failures(), "");
}

TEST(CollectivesTest, RejectsBadArguments) {
  auto run = testing::run_collective(2, [](CollectiveContext& ctx) -> Status {
    std::vector<int32_t> buf(8);
    std::vector<uint8_t> bytes(64);
    auto expect_invalid = [&](Status status, const char* fragment) -> Status {
      if (status.code() != StatusCode::kInvalidArgument ||
          status.message().find(fragment) == std::string::npos) {
        return internal_error("expected INVALID_ARGUMENT mentioning '{}', got {}", fragment,
                              status.to_string());
      }
      return ok_status();
    };
    COHORT_RETURN_IF_ERROR(expect_invalid(run_allreduce(ctx, buf.data(), 8, DataType::kInt32, ReduceOp::kAvg),
                                          "scale_for_average"));
    COHORT_RETURN_IF_ERROR(
        expect_invalid(run_reduce(ctx, buf.data(), 8, DataType::kInt32, ReduceOp::kSum, 2), "root 2"));
    COHORT_RETURN_IF_ERROR(expect_invalid(run_broadcast(ctx, bytes.data(), 8, -1), "root -1"));
    COHORT_RETURN_IF_ERROR(expect_invalid(run_allgatherv(ctx, bytes.data(), bytes.data(), {1, 2, 3}),
                                          "3 entries but the group has 2"));
    COHORT_RETURN_IF_ERROR(
        expect_invalid(run_alltoallv(ctx, bytes.data(), {1, 1}, bytes.data(), {1}), "recv_bytes"));
    COHORT_RETURN_IF_ERROR(
        expect_invalid(run_allreduce(ctx, nullptr, 8, DataType::kInt32, ReduceOp::kSum), "null"));
    COHORT_RETURN_IF_ERROR(expect_invalid(
        run_allreduce(ctx, buf.data(), 1, static_cast<DataType>(42), ReduceOp::kSum), "data type"));
    return ok_status();
  });
  EXPECT_EQ(run.failures(), "");
  EXPECT_EQ(run.transfers_posted, 0u);
}

TEST(CollectivesTest, DisagreeingPerRankSizesAreReported) {
  // Rank 1 believes it sends 50 bytes; the root expects 100 from it.
  auto run = testing::run_collective(2, [](CollectiveContext& ctx) {
    std::vector<uint8_t> send(100), recv(200);
    std::vector<size_t> bytes = {100, ctx.rank() == 0 ? size_t{100} : size_t{50}};
    return run_gatherv(ctx, send.data(), recv.data(), bytes, 0);
  });
  EXPECT_EQ(run.statuses[0].code(), StatusCode::kInvalidArgument) << run.statuses[0].to_string();
  EXPECT_NE(run.statuses[0].message().find("expected 100 bytes from rank 1 (step 0) but received 50"),
            std::string::npos)
      << run.statuses[0].message();
}

// A rank that never arrives: the others must fail with DEADLINE_EXCEEDED close to their 200 ms
// deadline — nothing hangs. Collectives where every rank depends on every other must fail on
// every rank that did arrive; rooted ones at least on the ranks waiting for the missing one.
TEST(CollectivesTest, RankThatNeverArrivesMakesOthersFailWithinTheDeadline) {
  constexpr milliseconds kDeadline(200);
  constexpr milliseconds kSlack(1500);  // a loaded two-core test machine
  for (const EntryPoint& entry : entry_points()) {
    for (Algorithm algorithm : kAllAlgorithms) {
      if (!implements(entry.collective, algorithm) && entry.collective != Collective::kBarrier) continue;
      if (entry.collective == Collective::kBarrier && algorithm != Algorithm::kAuto) continue;
      for (size_t n : {size_t{8}, size_t{300000}}) {
        const int size = 5;
        const int absent = 3;
        SCOPED_TRACE(
            fmt::format("{} {} n={}", collective_name(entry.collective), algorithm_name(algorithm), n));
        testing::RunOptions options;
        options.deadline = kDeadline;
        options.absent = {absent};
        options.op = std::string(collective_name(entry.collective));
        auto run = testing::run_collective(
            size, [&](CollectiveContext& ctx) { return entry.call(ctx, n, algorithm); }, options);
        int failed = 0;
        for (int rank = 0; rank < size; ++rank) {
          if (rank == absent) continue;
          EXPECT_LT(run.elapsed[rank], kDeadline + kSlack) << "rank " << rank;
          if (run.statuses[rank].ok()) continue;
          ++failed;
          EXPECT_EQ(run.statuses[rank].code(), StatusCode::kDeadlineExceeded)
              << run.statuses[rank].to_string();
          EXPECT_NE(run.statuses[rank].message().find("timed out after 200 ms"), std::string::npos)
              << run.statuses[rank].message();
          EXPECT_GE(run.elapsed[rank], kDeadline - milliseconds(5)) << "rank " << rank;
        }
        const bool rooted =
            entry.collective == Collective::kReduce || entry.collective == Collective::kBroadcast ||
            entry.collective == Collective::kGather || entry.collective == Collective::kScatter;
        EXPECT_GE(failed, 1);
        if (!rooted) {
          EXPECT_EQ(failed, size - 1);
        }
      }
    }
  }
}

}  // namespace
}  // namespace cohort::comm
