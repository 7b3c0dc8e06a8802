// The collectives of process_group.h with ranks as threads over the loopback transport, on
// non-power-of-two sizes, non-contiguous tensors and per-rank shapes; async_op Works, per-call
// timeouts and monitored_barrier's report of missing ranks.

#include "worker/distributed/collectives.h"

#include <chrono>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "worker/autograd/testing/autograd_ranks.h"
#include "worker/distributed/testing/expect_tensor.h"

namespace cohort::distributed {
namespace {

using autograd::testing::run_autograd_ranks;
using testing::error_of;
using testing::expect_contains;
using testing::expect_equal;
using Tensors = std::vector<at::Tensor>;
using namespace std::chrono_literals;

constexpr int kSizes[] = {1, 2, 3, 5, 8};

// Rank r's input: n values r*100 + i, as a [n] float tensor.
at::Tensor values(int rank, int64_t n) { return at::arange(n, at::kFloat).add(100.0 * rank); }

// A non-contiguous [rows, cols] view of fresh memory (the transpose of a [cols, rows] tensor).
at::Tensor strided(const at::Tensor& contiguous_rows_cols) {
  return contiguous_rows_cols.t().contiguous().t();
}

TEST(CollectivesTest, AllReduceSumsInPlaceIntoANonContiguousTensor) {
  for (int size : kSizes) {
    EXPECT_EQ(run_autograd_ranks(size,
                                 [size](int rank, comm::Communicator& comm) {
                                   at::Tensor t = strided(values(rank, 6).reshape({2, 3}));
                                   if (t.is_contiguous())
                                     throw std::runtime_error("the test tensor is contiguous");
                                   all_reduce(comm, t);
                                   at::Tensor want =
                                       values(0, 6).mul(size).add(100.0 * size * (size - 1) / 2);
                                   expect_equal(t, want.reshape({2, 3}), "all_reduce");
                                 }),
              "")
        << "size " << size;
  }
}

TEST(CollectivesTest, AsyncAllReduceReturnsAWorkThatCompletesTheCall) {
  EXPECT_EQ(run_autograd_ranks(3,
                               [](int rank, comm::Communicator& comm) {
                                 at::Tensor t = strided(at::full({2, 2}, rank + 1.0));
                                 auto work =
                                     all_reduce(comm, t, ReduceOp::kMax, {.async_op = true, .timeout = {}});
                                 if (!work->wait(5s)) throw std::runtime_error("wait returned false");
                                 if (!work->is_completed() || !work->is_success() || work->exception()) {
                                   throw std::runtime_error("a waited work is not completed successfully");
                                 }
                                 expect_equal(t, at::full({2, 2}, 3.0), "all_reduce max");
                               }),
            "");
}

TEST(CollectivesTest, BroadcastReduceFromTheLastRankLeaveOthersAsDocumented) {
  for (int size : kSizes) {
    EXPECT_EQ(run_autograd_ranks(size,
                                 [size](int rank, comm::Communicator& comm) {
                                   const int last = size - 1;
                                   at::Tensor b = values(rank, 5).to(at::kLong);
                                   broadcast(comm, b, last);
                                   expect_equal(b, values(last, 5).to(at::kLong), "broadcast");
                                   at::Tensor r = values(rank, 4).to(at::kDouble);
                                   reduce(comm, r, last, ReduceOp::kSum);
                                   at::Tensor mine = values(rank, 4).to(at::kDouble);
                                   at::Tensor sum = at::zeros({4}, at::kDouble);
                                   for (int q = 0; q < size; ++q) sum += values(q, 4).to(at::kDouble);
                                   expect_equal(r, rank == last ? sum : mine, "reduce");
                                 }),
              "")
        << "size " << size;
  }
}

TEST(CollectivesTest, AllGatherTakesShapesThatDifferPerRank) {
  for (int size : kSizes) {
    EXPECT_EQ(
        run_autograd_ranks(size,
                           [size](int rank, comm::Communicator& comm) {
                             Tensors list;
                             for (int r = 0; r < size; ++r) list.push_back(at::zeros({r + 1, 2}, at::kInt));
                             all_gather(comm, list, at::full({rank + 1, 2}, rank, at::kInt));
                             for (int r = 0; r < size; ++r) {
                               expect_equal(list[r], at::full({r + 1, 2}, r, at::kInt), "all_gather entry");
                             }
                             at::Tensor out = at::zeros({size, 3});
                             all_gather_into_tensor(comm, out, values(rank, 3));
                             for (int r = 0; r < size; ++r) expect_equal(out[r], values(r, 3), "into_tensor");
                           }),
        "")
        << "size " << size;
  }
}

TEST(CollectivesTest, GatherAndScatterWithPerRankNumels) {
  for (int size : kSizes) {
    EXPECT_EQ(run_autograd_ranks(size,
                                 [size](int rank, comm::Communicator& comm) {
                                   const int root = size / 2;
                                   Tensors list;
                                   if (rank == root) {
                                     for (int r = 0; r < size; ++r) list.push_back(at::zeros({r + 1}));
                                   }
                                   gather(comm, values(rank, rank + 1), list, root);
                                   for (size_t r = 0; r < list.size(); ++r) {
                                     expect_equal(list[r], values(r, r + 1), "gather entry");
                                   }
                                   Tensors parts;
                                   if (rank == root) {
                                     for (int r = 0; r < size; ++r) parts.push_back(values(r, 2 * r + 1));
                                   }
                                   at::Tensor mine = at::zeros({2 * rank + 1});
                                   scatter(comm, mine, parts, root);
                                   expect_equal(mine, values(rank, 2 * rank + 1), "scatter");
                                 }),
              "")
        << "size " << size;
  }
}

TEST(CollectivesTest, ReduceScatterListAndTensor) {
  for (int size : kSizes) {
    EXPECT_EQ(run_autograd_ranks(
                  size,
                  [size](int rank, comm::Communicator& comm) {
                    // input_list[r] = (rank + 1) * ones(r + 1): rank r gets sum_q (q + 1).
                    Tensors inputs;
                    for (int r = 0; r < size; ++r) inputs.push_back(at::full({r + 1}, rank + 1.0));
                    at::Tensor out = at::zeros({rank + 1});
                    reduce_scatter(comm, out, inputs);
                    expect_equal(out, at::full({rank + 1}, size * (size + 1) / 2.0), "reduce_scatter");
                    at::Tensor in = values(rank, 2 * size);
                    at::Tensor block = at::zeros({2});
                    reduce_scatter_tensor(comm, block, in, ReduceOp::kMin);
                    expect_equal(block, values(0, 2 * size).narrow(0, 2 * rank, 2), "min block");
                  }),
              "")
        << "size " << size;
  }
}

TEST(CollectivesTest, AllToAllAndAllToAllSingleWithUnevenSplits) {
  for (int size : kSizes) {
    EXPECT_EQ(run_autograd_ranks(size,
                                 [size](int rank, comm::Communicator& comm) {
                                   // Rank q sends rank r a block of (q + r + 1) values q * 10 + r.
                                   Tensors in, out;
                                   for (int r = 0; r < size; ++r) {
                                     in.push_back(at::full({rank + r + 1}, rank * 10.0 + r));
                                     out.push_back(at::zeros({r + rank + 1}));
                                   }
                                   all_to_all(comm, out, in);
                                   for (int q = 0; q < size; ++q) {
                                     expect_equal(out[q], at::full({q + rank + 1}, q * 10.0 + rank),
                                                  "all_to_all");
                                   }
                                   // all_to_all_single: rows of 2; rank q sends rank r (r + 1) rows.
                                   std::vector<int64_t> in_splits, out_splits;
                                   for (int r = 0; r < size; ++r) {
                                     in_splits.push_back(r + 1);
                                     out_splits.push_back(rank + 1);
                                   }
                                   at::Tensor input = at::full({size * (size + 1) / 2, 2}, rank * 1.0);
                                   at::Tensor output = at::zeros({size * (rank + 1), 2});
                                   all_to_all_single(comm, output, input, out_splits, in_splits);
                                   for (int q = 0; q < size; ++q) {
                                     expect_equal(output.narrow(0, q * (rank + 1), rank + 1),
                                                  at::full({rank + 1, 2}, q * 1.0), "all_to_all_single");
                                   }
                                 }),
              "")
        << "size " << size;
  }
}

TEST(CollectivesTest, BadArgumentsAreNamedErrors) {
  EXPECT_EQ(run_autograd_ranks(
                2,
                [](int rank, comm::Communicator& comm) {
                  expect_contains(
                      error_of([&] { all_gather(comm, {at::zeros({1})}, at::zeros({1})); }, "short list"),
                      "tensor_list has 1 tensors; it needs one per rank (2)", "list");
                  expect_contains(
                      error_of([&] { all_to_all_single(comm, at::zeros({3}), at::zeros({3})); }, "uneven"),
                      "must divide by the group size 2", "splits");
                  barrier(comm);
                }),
            "");
}

TEST(CollectivesTest, APeerThatNeverJoinsFailsTheCallAfterItsOwnTimeout) {
  EXPECT_EQ(run_autograd_ranks(
                2,
                [](int rank, comm::Communicator& comm) {
                  if (rank == 1) return;  // never joins
                  at::Tensor t = at::ones({4});
                  auto start = std::chrono::steady_clock::now();
                  auto work = all_reduce(comm, t, ReduceOp::kSum, {.async_op = true, .timeout = 300ms});
                  // wait(timeout) shorter than the call's: the call goes on.
                  expect_contains(error_of([&] { work->wait(50ms); }, "short wait"),
                                  "not finished within the wait timeout", "wait(50ms)");
                  expect_contains(error_of([&] { work->wait(); }, "wait"), "all_reduce", "wait()");
                  if (!work->is_completed() || work->is_success() || !work->exception()) {
                    throw std::runtime_error("a failed work must be completed with an exception");
                  }
                  if (std::chrono::steady_clock::now() - start > 5s) {
                    throw std::runtime_error("the 300 ms timeout took over 5 s");
                  }
                }),
            "");
}

TEST(CollectivesTest, MonitoredBarrierNamesTheRanksThatDidNotArrive) {
  EXPECT_EQ(run_autograd_ranks(
                5,
                [](int rank, comm::Communicator& comm) {
                  monitored_barrier(comm, 2s);  // everyone arrives
                  if (rank == 2 || rank == 4) return;
                  std::string error = error_of([&] { monitored_barrier(comm, 300ms, true); }, "missing");
                  if (rank == 0) {
                    expect_contains(error, "ranks 2, 4 did not arrive within 300 ms", "rank 0");
                  } else {
                    expect_contains(error, "rank 0 found 2 rank(s) that did not arrive", "others");
                  }
                }),
            "");
}

// A rank 0 that arrives later than the timeout (but within twice it, as collectives.h promises
// the others wait) still passes the barrier: the others' arrivals wait for it too, even where a
// send completes only once its receive is posted (the loopback transport here).
TEST(CollectivesTest, MonitoredBarrierWaitsForALateRankZero) {
  EXPECT_EQ(run_autograd_ranks(3,
                               [](int rank, comm::Communicator& comm) {
                                 if (rank == 0) std::this_thread::sleep_for(700ms);
                                 monitored_barrier(comm, 400ms);
                               }),
            "");
}

}  // namespace
}  // namespace cohort::distributed
