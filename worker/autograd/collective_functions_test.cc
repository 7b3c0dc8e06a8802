#include "worker/autograd/collective_functions.h"

#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "worker/autograd/testing/test_tensors.h"

#include "worker/autograd/testing/autograd_ranks.h"

namespace cohort::autograd {
namespace {

using Tensors = std::vector<at::Tensor>;
using testing::run_autograd_ranks;

constexpr int kSizes[] = {1, 2, 3, 4};

using autograd::testing::data;
using autograd::testing::numel_of;
using autograd::testing::upstream;

struct GradCase {
  // The input of `rank`; undefined where the op takes none (non-root bcast / scatter).
  std::function<at::Tensor(int rank, int size)> input;
  std::function<at::Tensor(comm::Communicator& comm, const at::Tensor& x)> op;
  // Every rank's output computed in one process with plain libtorch ops; undefined where the
  // op returns a delegate.
  std::function<Tensors(const Tensors& xs)> reference;
};

// Runs `c` on `size` ranks with loss_r = sum(y_r * upstream_r) and compares outputs and input
// gradients with the single-process reference of sum_r loss_r.
void check_gradients(int size, const GradCase& c) {
  SCOPED_TRACE(::testing::Message() << "size " << size);
  Tensors leaves;
  for (int r = 0; r < size; ++r) {
    at::Tensor x = c.input(r, size);
    leaves.push_back(x.defined() ? x.clone().set_requires_grad(true) : x);
  }
  Tensors expected = c.reference(leaves);
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (int r = 0; r < size; ++r) {
    if (expected[r].defined()) loss = loss + expected[r].mul(upstream(r, expected[r].sizes())).sum();
  }
  if (loss.requires_grad()) loss.backward();
  Tensors expected_grads;
  for (int r = 0; r < size; ++r) {
    const at::Tensor& x = leaves[r];
    expected_grads.push_back(!x.defined() ? x : x.grad().defined() ? x.grad() : at::zeros_like(x));
  }

  std::string failures = run_autograd_ranks(size, [&](int rank, comm::Communicator& comm) {
    at::Tensor x = c.input(rank, size);
    if (x.defined()) x.set_requires_grad(true);
    at::Tensor y = c.op(comm, x);
    if (expected[rank].defined()) {
      EXPECT_TRUE(at::allclose(y, expected[rank].detach())) << "rank " << rank << " output\n" << y << "\nexpected\n"
                                                            << expected[rank];
      y.mul(upstream(rank, y.sizes())).sum().backward();
    } else {
      EXPECT_EQ(y.dim(), 0) << "rank " << rank << ": expected a delegate";
      y.backward();
    }
    if (x.defined()) {
      ASSERT_TRUE(x.grad().defined()) << "rank " << rank;
      EXPECT_TRUE(at::allclose(x.grad(), expected_grads[rank])) << "rank " << rank << " grad\n" << x.grad()
                                                                 << "\nexpected\n" << expected_grads[rank];
    }
  });
  EXPECT_EQ(failures, "");
}

at::Tensor stacked(const Tensors& xs) { return at::stack(xs); }

Tensors same_for_all(const at::Tensor& y, size_t size) { return Tensors(size, y); }

GradCase allreduce_case(comm::ReduceOp op, std::function<at::Tensor(const at::Tensor&)> reduce_rows,
                        std::function<at::Tensor(int, int)> input = [](int rank, int) { return data(rank, {2, 3}); }) {
  return GradCase{input, [op](comm::Communicator& comm, const at::Tensor& x) { return allreduce(comm, x, op); },
                  [reduce_rows](const Tensors& xs) { return same_for_all(reduce_rows(stacked(xs)), xs.size()); }};
}

TEST(CollectiveFunctionsTest, AllreduceSum) {
  auto c = allreduce_case(comm::ReduceOp::kSum, [](const at::Tensor& s) { return s.sum(0); });
  for (int size : kSizes) check_gradients(size, c);
}

TEST(CollectiveFunctionsTest, AllreduceAvg) {
  auto c = allreduce_case(comm::ReduceOp::kAvg, [](const at::Tensor& s) { return s.mean(0); });
  for (int size : kSizes) check_gradients(size, c);
}

TEST(CollectiveFunctionsTest, AllreduceMaxAndMinRouteToTheExtremeAndSplitTies) {
  // Values in {0, 1, 2}: many elements tie across ranks; amax / amin split ties evenly too.
  auto ties = [](int rank, int) { return at::arange(12, at::kDouble).add(rank).remainder(3).reshape({3, 4}); };
  auto max_case = allreduce_case(comm::ReduceOp::kMax, [](const at::Tensor& s) { return s.amax(0); }, ties);
  auto min_case = allreduce_case(comm::ReduceOp::kMin, [](const at::Tensor& s) { return s.amin(0); }, ties);
  auto max_distinct = allreduce_case(comm::ReduceOp::kMax, [](const at::Tensor& s) { return s.amax(0); });
  for (int size : kSizes) {
    check_gradients(size, max_case);
    check_gradients(size, min_case);
    check_gradients(size, max_distinct);
  }
}

TEST(CollectiveFunctionsTest, AllreduceProductHandlesZeros) {
  // Element 0 is zero on rank 0; element 1 on ranks 0 and 1: dividing by x would give NaN.
  auto with_zeros = [](int rank, int) {
    at::Tensor x = data(rank, {5});
    if (rank == 0) x[0].fill_(0.0);
    if (rank <= 1) x[1].fill_(0.0);
    return x;
  };
  auto c = allreduce_case(comm::ReduceOp::kProduct, [](const at::Tensor& s) { return s.prod(0); }, with_zeros);
  for (int size : kSizes) check_gradients(size, c);
}

TEST(CollectiveFunctionsTest, Bcast) {
  for (int size : kSizes) {
    int root = size - 1;
    GradCase c{[root](int rank, int) { return rank == root ? data(rank, {3, 2}) : at::Tensor(); },
               [root](comm::Communicator& comm, const at::Tensor& x) { return bcast(comm, x, root); },
               [root](const Tensors& xs) { return same_for_all(xs[root].mul(1), xs.size()); }};
    check_gradients(size, c);
  }
}

TEST(CollectiveFunctionsTest, ReduceReturnsDelegatesOffRoot) {
  for (int size : kSizes) {
    int root = size / 2;
    GradCase c{[](int rank, int) { return data(rank, {4}); },
               [root](comm::Communicator& comm, const at::Tensor& x) { return reduce(comm, x, root); },
               [root](const Tensors& xs) {
                 Tensors ys(xs.size());
                 ys[root] = stacked(xs).sum(0);
                 return ys;
               }};
    check_gradients(size, c);
  }
}

TEST(CollectiveFunctionsTest, GatherReturnsDelegatesOffRoot) {
  for (int size : kSizes) {
    int root = size - 1;
    GradCase c{[](int rank, int) { return data(rank, {2, 2}); },
               [root](comm::Communicator& comm, const at::Tensor& x) { return gather(comm, x, root); },
               [root](const Tensors& xs) {
                 Tensors ys(xs.size());
                 ys[root] = stacked(xs);
                 return ys;
               }};
    check_gradients(size, c);
  }
}

TEST(CollectiveFunctionsTest, Scatter) {
  for (int size : kSizes) {
    int root = 0;
    GradCase c{[root](int rank, int n) { return rank == root ? data(rank, {n, 3}) : at::Tensor(); },
               [root](comm::Communicator& comm, const at::Tensor& x) { return scatter(comm, x, root); },
               [root](const Tensors& xs) {
                 Tensors ys;
                 for (size_t r = 0; r < xs.size(); ++r) ys.push_back(xs[root][static_cast<int64_t>(r)]);
                 return ys;
               }};
    check_gradients(size, c);
  }
}

TEST(CollectiveFunctionsTest, AllgatherStacked) {
  GradCase c{[](int rank, int) { return data(rank, {3}); },
             [](comm::Communicator& comm, const at::Tensor& x) { return allgather_stacked(comm, x); },
             [](const Tensors& xs) { return same_for_all(stacked(xs), xs.size()); }};
  for (int size : kSizes) check_gradients(size, c);
}

// The shape of rank r's input: r+1 rows, and a 1-dim tensor on rank 2 (dims may differ too).
std::vector<int64_t> ragged_shape(int rank) {
  if (rank == 2) return {4};
  return {rank + 1, 2};
}

// ChainerMN's functions.allgather: one tensor per rank, rank r's with rank r's shape. The loss of
// rank q is Σ_r sum(ys[r] · u_{q,r}), so rank r's gradient is Σ_q u_{q,r}: every rank's
// upstream of its result[r], summed at rank r. Rank 1 leaves result[0] out of its loss (an
// undefined gradient, counted as zero).
TEST(CollectiveFunctionsTest, AllgatherReturnsOneTensorPerRankWithItsOwnShape) {
  auto weight = [](int q, int r, at::IntArrayRef shape) { return upstream(q * 7 + r, shape); };
  for (int size : {1, 2, 3, 4, 5}) {
    std::string failures = run_autograd_ranks(size, [&](int rank, comm::Communicator& comm) {
      at::Tensor x = data(rank, ragged_shape(rank)).set_requires_grad(true);
      std::vector<at::Tensor> ys = allgather(comm, x);
      ASSERT_EQ(static_cast<int>(ys.size()), size);
      at::Tensor loss = at::zeros({}, at::kDouble);
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(ys[r].sizes(), at::IntArrayRef(ragged_shape(r))) << "rank " << rank << " result " << r;
        EXPECT_TRUE(at::equal(ys[r], data(r, ragged_shape(r)))) << "rank " << rank << " result " << r;
        EXPECT_TRUE(ys[r].requires_grad());
        if (rank == 1 && r == 0) continue;
        loss = loss + ys[r].mul(weight(rank, r, ys[r].sizes())).sum();
      }
      loss.backward();
      at::Tensor want = at::zeros(ragged_shape(rank), at::kDouble);
      for (int q = 0; q < size; ++q) {
        if (q == 1 && rank == 0) continue;
        want = want + weight(q, rank, want.sizes());
      }
      ASSERT_TRUE(x.grad().defined());
      EXPECT_TRUE(at::allclose(x.grad(), want)) << "rank " << rank << " grad\n" << x.grad() << "\nexpected\n" << want;
      // Each result is its own tensor: modifying one in place leaves the others alone.
      std::vector<at::Tensor> again = allgather(comm, x.detach());
      again[0].add_(1);
      if (size > 1) {
        EXPECT_TRUE(at::equal(again[1], data(1, ragged_shape(1))));
      }
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

TEST(CollectiveFunctionsTest, AllgatherOfDifferentDtypesFailsOnEveryRank) {
  std::string failures = run_autograd_ranks(3, [&](int rank, comm::Communicator& comm) {
    try {
      allgather(comm, at::ones({2}, rank == 1 ? at::kFloat : at::kDouble));
      ADD_FAILURE() << "rank " << rank << ": expected an error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1: Float"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(CollectiveFunctionsTest, ReduceScatter) {
  GradCase c{[](int rank, int n) { return data(rank, {n, 2}); },
             [](comm::Communicator& comm, const at::Tensor& x) { return reduce_scatter(comm, x); },
             [](const Tensors& xs) {
               Tensors ys;
               at::Tensor sum = stacked(xs).sum(0);
               for (size_t r = 0; r < xs.size(); ++r) ys.push_back(sum[static_cast<int64_t>(r)]);
               return ys;
             }};
  for (int size : kSizes) check_gradients(size, c);
}

TEST(CollectiveFunctionsTest, Alltoall) {
  GradCase c{[](int rank, int n) { return data(rank, {n, 2}); },
             [](comm::Communicator& comm, const at::Tensor& x) { return alltoall(comm, x); },
             [](const Tensors& xs) {
               // y_r[q] = xs_q[r]: a transpose of the first two dimensions.
               at::Tensor t = stacked(xs).transpose(0, 1);
               Tensors ys;
               for (size_t r = 0; r < xs.size(); ++r) ys.push_back(t[static_cast<int64_t>(r)]);
               return ys;
             }};
  for (int size : kSizes) check_gradients(size, c);
}

TEST(CollectiveFunctionsTest, FloatingDtypesAreDifferentiable) {
  for (at::ScalarType type : {at::kHalf, at::kBFloat16, at::kFloat, at::kDouble}) {
    std::string failures = run_autograd_ranks(3, [&](int rank, comm::Communicator& comm) {
      // Small integers: exact in every floating dtype.
      at::Tensor x = at::arange(4, at::TensorOptions(type)).add(rank).set_requires_grad(true);
      at::Tensor y = allreduce(comm, x, comm::ReduceOp::kSum);
      EXPECT_EQ(y.scalar_type(), type);
      EXPECT_TRUE(at::equal(y, at::arange(4, at::TensorOptions(type)).mul(3).add(3)));
      y.mul(rank + 1).sum().backward();
      EXPECT_TRUE(at::equal(x.grad(), at::full({4}, 6, at::TensorOptions(type))));
    });
    EXPECT_EQ(failures, "") << c10::toString(type);
  }
}

TEST(CollectiveFunctionsTest, IntegerTensorsCommunicateWithoutGradients) {
  EXPECT_THROW(at::ones({2}, at::kLong).set_requires_grad(true), c10::Error);
  for (int size : kSizes) {
    std::string failures = run_autograd_ranks(size, [&](int rank, comm::Communicator& comm) {
      at::Tensor x = at::full({3}, rank + 1, at::kLong);
      at::Tensor y = allreduce(comm, x, comm::ReduceOp::kSum);
      EXPECT_FALSE(y.requires_grad());
      EXPECT_TRUE(at::equal(y, at::full({3}, size * (size + 1) / 2, at::kLong)));
      at::Tensor all = allgather_stacked(comm, x);
      EXPECT_EQ(all.size(0), size);
      std::vector<at::Tensor> each = allgather(comm, x);
      EXPECT_EQ(static_cast<int>(each.size()), size);
      EXPECT_FALSE(each.back().requires_grad());
      EXPECT_TRUE(at::equal(each.back(), at::full({3}, size, at::kLong)));
      at::Tensor from_root = bcast(comm, rank == 0 ? at::arange(5, at::kInt) : at::Tensor(), 0);
      EXPECT_TRUE(at::equal(from_root, at::arange(5, at::kInt)));
      at::Tensor part = scatter(comm, rank == 0 ? at::arange(2 * size, at::kLong).reshape({size, 2}) : at::Tensor(), 0);
      EXPECT_TRUE(at::equal(part, at::arange(2 * rank, 2 * rank + 2, at::kLong)));
    });
    EXPECT_EQ(failures, "");
  }
}

TEST(CollectiveFunctionsTest, WrongBlockCountIsAClearError) {
  std::string failures = run_autograd_ranks(2, [&](int, comm::Communicator& comm) {
    try {
      alltoall(comm, at::zeros({3, 2}));
      ADD_FAILURE() << "expected an error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("expected a tensor of shape [2, ...]"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(failures, "");
}

// CPU and CUDA tensors are communicated; a tensor on any other device is refused by name before
// any communication (the meta device stands in for one here).
TEST(CollectiveFunctionsTest, TensorsOutsideCpuAndCudaAreAClearError) {
  std::string failures = run_autograd_ranks(2, [&](int, comm::Communicator& comm) {
    try {
      allreduce(comm, at::empty({3}, at::TensorOptions(at::kFloat).device(at::kMeta)));
      ADD_FAILURE() << "expected an error";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("only CPU and CUDA tensors can be communicated, got one on meta"),
                std::string::npos)
          << e.what();
    }
  });
  EXPECT_EQ(failures, "");
}

// A rank that skips its backward makes the others' backward fail with a named timeout, not hang.
TEST(CollectiveFunctionsTest, BackwardWhosePeerNeverRunsBackwardTimesOut) {
  std::string failures = run_autograd_ranks(
      2,
      [&](int rank, comm::Communicator& comm) {
        at::Tensor x = data(rank, {3}).set_requires_grad(true);
        at::Tensor y = allreduce(comm, x, comm::ReduceOp::kSum);
        if (rank == 1) return;  // never runs backward
        try {
          y.sum().backward();
          ADD_FAILURE() << "expected a timeout";
        } catch (const std::exception& e) {
          std::string what = e.what();
          EXPECT_NE(what.find("DEADLINE_EXCEEDED"), std::string::npos) << what;
          EXPECT_NE(what.find("allreduce"), std::string::npos) << what;
        }
      },
      std::chrono::seconds(1));
  EXPECT_EQ(failures, "");
}

// The averaging ensemble: each rank trains its own linear model; the prediction is the mean of
// every rank's output (allgather → mean), and every rank's loss decreases.
TEST(CollectiveFunctionsTest, AveragingEnsembleTrains) {
  for (int size : kSizes) {
    std::string failures = run_autograd_ranks(size, [&](int rank, comm::Communicator& comm) {
      at::Tensor inputs = data(7, {16, 4});
      at::Tensor target = inputs.matmul(at::arange(4, at::kDouble).sub(1.5));
      at::Tensor w = data(rank + 10, {4}).set_requires_grad(true);
      double first = 0, last = 0;
      for (int step = 0; step < 30; ++step) {
        at::Tensor mean = at::stack(allgather(comm, inputs.matmul(w))).mean(0);
        at::Tensor loss = mean.sub(target).pow(2).mean();
        loss.backward();
        {
          at::NoGradGuard no_grad;
          w.sub_(w.grad().mul(0.05));
          w.grad().zero_();
        }
        (step == 0 ? first : last) = loss.item<double>();
      }
      EXPECT_LT(last, first * 0.1) << "rank " << rank << ": loss " << first << " → " << last;
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

}  // namespace
}  // namespace cohort::autograd
