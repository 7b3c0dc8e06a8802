#include "worker/autograd/point_to_point_functions.h"

#include <chrono>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "worker/autograd/tensor_comm.h"
#include "worker/autograd/tensor_header.h"
#include "worker/autograd/testing/autograd_ranks.h"
#include "worker/autograd/wait_handle.h"

namespace cohort::autograd {
namespace {

using testing::run_autograd_ranks;

// A backward whose received input came without grad sends nothing back, so it must not wait for
// a peer: it ends at once, not after the ops' 10 s timeout.
void expect_prompt_backward(const at::Tensor& loss) {
  auto start = std::chrono::steady_clock::now();
  loss.backward();
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, std::chrono::seconds(2))
      << "backward took " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
}

at::Tensor values(double scale, int64_t n) { return at::arange(n, at::kDouble).mul(scale).add(0.25).sin(); }

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// ChainerMN's Model_0 / Model_1: rank 0 runs the first layer and the loss, rank 1 the second
// layer; rank 0's recv takes the delegate of its send so one backward covers both transfers.
TEST(PointToPointFunctionsTest, ModelParallelWithDelegateVariable) {
  const int64_t n = 5;
  at::Tensor x = values(0.3, n), w0 = values(0.7, n).add(1), w1 = values(1.1, n).sub(2), up = values(0.9, n).add(3);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    if (rank == 0) {  // Model_0
      at::Tensor p0 = w0.clone().set_requires_grad(true);
      at::Tensor phi = send(comm, x.mul(p0), 1, 0);
      at::Tensor y = recv(comm, 1, 1, phi, std::vector<int64_t>{n}, at::kDouble);
      EXPECT_TRUE(at::allclose(y, x * w0 * w1));
      y.mul(up).sum().backward();
      EXPECT_TRUE(at::allclose(p0.grad(), up * w1 * x));
    } else {  // Model_1
      at::Tensor p1 = w1.clone().set_requires_grad(true);
      at::Tensor h = recv(comm, 0, 0, {}, std::vector<int64_t>{n}, at::kDouble);
      at::Tensor phi = send(comm, h.mul(p1), 0, 1);
      phi.backward();
      EXPECT_TRUE(at::allclose(p1.grad(), up * x * w0));
    }
  });
  EXPECT_EQ(failures, "");
}

// Two sends from one rank: pseudo_connect joins both delegates so a single backward receives
// both gradients.
TEST(PointToPointFunctionsTest, TwoSendsJoinedWithPseudoConnect) {
  at::Tensor wa = values(0.4, 3).add(2), wb = values(1.3, 4).sub(1);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    if (rank == 0) {
      at::Tensor a = values(0.1, 3).set_requires_grad(true), b = values(0.2, 4).set_requires_grad(true);
      at::Tensor phi_a = send(comm, a.mul(2), 1, 0);
      at::Tensor phi_b = send(comm, b, 1, 1);
      pseudo_connect(phi_a, phi_b).backward();
      EXPECT_TRUE(at::allclose(a.grad(), wa.mul(2)));
      EXPECT_TRUE(at::allclose(b.grad(), wb));
    } else {
      at::Tensor ra = recv(comm, 0, 0, {}, std::vector<int64_t>{3}, at::kDouble);
      at::Tensor rb = recv(comm, 0, 1, {}, std::vector<int64_t>{4}, at::kDouble);
      ra.mul(wa).sum().add(rb.mul(wb).sum()).backward();
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(PointToPointFunctionsTest, PseudoConnectPassesValuesAndGradients) {
  at::Tensor delegate = at::zeros({}, at::kDouble).set_requires_grad(true);
  at::Tensor a = values(0.5, 3).set_requires_grad(true);
  at::Tensor b = values(0.6, 2).set_requires_grad(true);
  auto out = pseudo_connect(delegate, at::TensorList({a, b}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(at::equal(out[0], a));
  out[0].mul(values(0.8, 3)).sum().add(out[1].mul(3).sum()).backward();
  EXPECT_TRUE(at::allclose(a.grad(), values(0.8, 3)));
  EXPECT_TRUE(at::allclose(b.grad(), at::full({2}, 3.0, at::kDouble)));
  ASSERT_TRUE(delegate.grad().defined());
  EXPECT_EQ(delegate.grad().item<double>(), 0.0);
}

TEST(PointToPointFunctionsTest, MisuseIsAClearError) {
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    EXPECT_NE(error_of([&] { send(comm, at::ones({2}), rank, 0); }).find("this rank"), std::string::npos);
    EXPECT_NE(error_of([&] { isend(comm, at::ones({2}), rank, 0); }).find("this rank"), std::string::npos);
    EXPECT_NE(error_of([&] { irecv(comm, 1 - rank, 0, {}, std::nullopt); }).find("no shape"), std::string::npos);
    EXPECT_NE(error_of([&] { send(comm, at::ones({2}), 1 - rank, kGradientTagBit); }).find("tag"), std::string::npos);
    EXPECT_NE(error_of([&] { send(comm, at::ones({2}), 1 - rank, kMaxUserTag + 1); }).find("exceeds the maximum"),
              std::string::npos);
    EXPECT_NE(error_of([&] { recv(comm, 1 - rank, kHeaderTagBit); }).find("exceeds the maximum"), std::string::npos);
    EXPECT_NE(error_of([&] { send(comm, at::ones(std::vector<int64_t>(kMaxHeaderDims + 1, 1)), 1 - rank); })
                  .find("dimensions cannot be sent"),
              std::string::npos);
    at::Tensor delegate = at::zeros({}).set_requires_grad(true);
    EXPECT_NE(error_of([&] { recv(comm, 1 - rank, 0, delegate, std::vector<int64_t>{2}, at::kLong); })
                  .find("integer dtype"),
              std::string::npos);
  });
  EXPECT_EQ(failures, "");
}

// ChainerMN's recv(comm, peer) without shape or dtype: they travel with the data. Tensors of 0 to
// 4 dims and several dtypes arrive as sent, and the gradient of one that required grad on the
// sender still flows back (the others arrive without grad: nothing would receive theirs).
TEST(PointToPointFunctionsTest, RecvWithoutShapeOrDtypeTakesTheSenders) {
  const std::vector<at::Tensor> sent = {
      at::full({}, 2.5, at::kDouble), values(0.4, 6).to(at::kFloat), values(0.7, 24).reshape({2, 3, 4}),
      at::arange(10, at::kInt).reshape({1, 2, 5, 1}), at::zeros({0, 3}, at::kDouble)};
  at::Tensor up = values(1.3, 6).add(2).to(at::kFloat);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    if (rank == 0) {
      at::Tensor x = sent[1].clone().set_requires_grad(true);
      for (size_t i = 0; i < sent.size(); ++i) {
        if (i == 1) {
          send(comm, x.mul(3), 1, 5).backward();  // receives dL/d(3x) from rank 1
          continue;
        }
        send(comm, sent[i], 1, 5);
      }
      EXPECT_TRUE(at::allclose(x.grad(), up.mul(3))) << x.grad();
    } else {
      for (size_t i = 0; i < sent.size(); ++i) {
        at::Tensor y = recv(comm, 0, 5);
        EXPECT_EQ(y.scalar_type(), sent[i].scalar_type()) << "tensor " << i;
        EXPECT_EQ(y.sizes(), sent[i].sizes()) << "tensor " << i;
        at::Tensor want = i == 1 ? sent[1].mul(3) : sent[i];
        EXPECT_TRUE(at::equal(y, want)) << "tensor " << i;
        EXPECT_EQ(y.requires_grad(), i == 1) << "tensor " << i;
        if (i == 1) y.mul(up).sum().backward();
      }
    }
  });
  EXPECT_EQ(failures, "");
}

// A recv that names a shape or dtype the sender did not send fails naming both, drains the data
// (the sender completes), and the next tensor on the tag arrives intact. A shape of the same size
// is a reshape, as before.
TEST(PointToPointFunctionsTest, RecvWhoseShapeOrDtypeDisagreesNamesBothAndDrains) {
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    if (rank == 0) {
      send(comm, at::ones({4}, at::kFloat), 1, 2);
      send(comm, at::ones({4}, at::kFloat), 1, 2);
      send(comm, values(0.2, 6), 1, 2);
      send(comm, values(0.3, 6), 1, 2);
      return;
    }
    std::string wrong_size = error_of([&] { recv(comm, 0, 2, {}, std::vector<int64_t>{5}, at::kFloat); });
    EXPECT_NE(wrong_size.find("sent Float [4] but this rank asked for Float [5]"), std::string::npos) << wrong_size;
    std::string wrong_type = error_of([&] { recv(comm, 0, 2, {}, std::nullopt, at::kDouble); });
    EXPECT_NE(wrong_type.find("sent Float [4] but this rank asked for Double [4]"), std::string::npos) << wrong_type;
    at::Tensor reshaped = recv(comm, 0, 2, {}, std::vector<int64_t>{2, 3});
    EXPECT_TRUE(at::equal(reshaped, values(0.2, 6).reshape({2, 3})));
    EXPECT_TRUE(at::equal(recv(comm, 0, 2), values(0.3, 6)));
  });
  EXPECT_EQ(failures, "");
}

// A float tensor sent without grad (a frozen first stage, a target): the sender has no backward
// and posts no gradient receive, so the receiver sends no gradient. Its result does not require
// grad; its loss's backward finishes at once (not after the 10 s op timeout) and gives the
// parameters on its side their gradients. A stray gradient left on the tag's gradient channel
// would be taken by the next send's backward on that tag: the tensor that does require grad,
// sent after, gets exactly its own gradient.
TEST(PointToPointFunctionsTest, TensorSentWithoutGradGetsNoGradientBack) {
  const int64_t n = 4096;
  at::Tensor w = values(0.6, n).add(2), up = values(0.9, n).sub(3);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    if (rank == 0) {
      at::Tensor frozen = send(comm, at::ones({n}, at::kFloat), 1, 4);
      EXPECT_FALSE(frozen.requires_grad());
      at::Tensor x = values(0.2, n).set_requires_grad(true);
      send(comm, x, 1, 4).backward();  // receives dL/dx from rank 1
      EXPECT_TRUE(at::allclose(x.grad(), up)) << x.grad();
      return;
    }
    at::Tensor p = w.to(at::kFloat).set_requires_grad(true);
    at::Tensor y = recv(comm, 0, 4);
    EXPECT_FALSE(y.requires_grad());
    expect_prompt_backward(p.mul(y).sum());
    EXPECT_TRUE(at::allclose(p.grad(), at::ones({n}, at::kFloat)));
    at::Tensor h = recv(comm, 0, 4);
    EXPECT_TRUE(h.requires_grad());
    h.mul(up).sum().backward();
  });
  EXPECT_EQ(failures, "");
}

// With a delegate (ChainerMN's pipeline: rank 1 sent first, then receives what a frozen part of
// rank 0 computed), the result requires grad through the delegate only: backward sends nothing
// for the frozen tensor and still reaches the delegate, whose send receives its gradient.
TEST(PointToPointFunctionsTest, TensorSentWithoutGradStillRunsTheDelegatesBackward) {
  const int64_t n = 5;
  at::Tensor w = values(0.7, n).add(1), up = values(0.9, n).add(3), target = values(1.7, n);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    if (rank == 0) {
      at::Tensor h = recv(comm, 1, 0);
      EXPECT_TRUE(h.requires_grad());
      send(comm, target, 1, 1);
      h.mul(up).sum().backward();  // sends dL/dh to rank 1
      return;
    }
    at::Tensor p = w.clone().set_requires_grad(true);
    at::Tensor phi = send(comm, p.mul(2), 0, 0);
    at::Tensor t = recv(comm, 0, 1, phi);
    EXPECT_TRUE(at::equal(t, target));
    EXPECT_TRUE(t.requires_grad());  // through phi
    auto start = std::chrono::steady_clock::now();
    t.sum().backward();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    EXPECT_TRUE(at::allclose(p.grad(), up.mul(2))) << p.grad();
  });
  EXPECT_EQ(failures, "");
}

TEST(PointToPointFunctionsTest, IntegerSendRecvCarriesNoGradient) {
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    if (rank == 0) {
      send(comm, at::arange(4, at::kLong), 1, 0);
      send(comm, at::arange(4, at::kLong), 1, 0);
    } else {
      at::Tensor y = recv(comm, 0, 0, {}, std::vector<int64_t>{4}, at::kLong);
      EXPECT_FALSE(y.requires_grad());
      EXPECT_TRUE(at::equal(y, at::arange(4, at::kLong)));
      y = recv(comm, 0, 0);  // the dtype from the header: no gradient either
      EXPECT_FALSE(y.requires_grad());
      EXPECT_EQ(y.scalar_type(), at::kLong);
      EXPECT_TRUE(at::equal(y, at::arange(4, at::kLong)));
    }
  });
  EXPECT_EQ(failures, "");
}

// mpi4torch's ring: Isend to the next rank, Recv from the previous one (ordered after the
// Isend through its dummy), Wait, and join the Wait's output into the result. Every element of
// `a` reaches the loss twice (directly and through the next rank), so a.grad == 2.
TEST(WaitHandleTest, RingIsendRecvWaitGivesGradTwoWithJoinDummies) {
  for (int size : {2, 3, 4}) {
    std::string failures = run_autograd_ranks(size, [&](int rank, comm::Communicator& comm) {
      at::Tensor a = at::rand({10}, at::kDouble).set_requires_grad(true);
      WaitHandle handle = isend(comm, a, (rank + 1) % size, 0);
      at::Tensor b = recv(comm, (rank + size - 1) % size, 0, handle.dummy(), std::vector<int64_t>{10}, at::kDouble);
      at::Tensor sent = wait(handle);
      EXPECT_TRUE(at::equal(sent, a));
      at::Tensor res = join_dummies(a + b, {sent});
      res.sum().backward();
      EXPECT_TRUE(at::allclose(a.grad(), at::full({10}, 2.0, at::kDouble))) << a.grad();
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

// The same ring without joining the Wait's output: the Wait is not in the graph, so its backward
// never posts the gradient receive. Under MPI's eager sends mpi4torch gets a.grad == 1; cohort's
// sends complete only when matched, so each rank's gradient send fails with a named timeout
// instead of hanging.
TEST(WaitHandleTest, RingWithoutJoinDummiesFailsWithANamedTimeout) {
  std::string failures = run_autograd_ranks(
      3,
      [&](int rank, comm::Communicator& comm) {
        at::Tensor a = at::rand({4}, at::kDouble).set_requires_grad(true);
        WaitHandle handle = isend(comm, a, (rank + 1) % 3, 0);
        at::Tensor b = recv(comm, (rank + 2) % 3, 0, {}, std::vector<int64_t>{4}, at::kDouble);
        wait(handle);
        std::string error = error_of([&] { a.add(b).sum().backward(); });
        EXPECT_NE(error.find("recv backward: sending the gradient"), std::string::npos) << error;
        EXPECT_NE(error.find("DEADLINE_EXCEEDED"), std::string::npos) << error;
      },
      std::chrono::seconds(1));
  EXPECT_EQ(failures, "");
}

// isend of a tensor without grad, irecv on the other side: the graph of the irecv is built before
// the header arrives, but wait() learns from it that the sender takes no gradient, so the Wait's
// backward sends none and the irecv's completes at once. The receiver's parameter gets its
// gradient; a following transfer on the same tag carries its gradient unchanged.
TEST(WaitHandleTest, IrecvOfATensorSentWithoutGradSendsNoGradient) {
  const int64_t n = 4096;
  at::Tensor w = values(0.6, n).add(2), up = values(0.9, n).sub(3);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    if (rank == 0) {
      at::Tensor sent = wait(isend(comm, at::ones({n}, at::kDouble), 1, 6));
      EXPECT_FALSE(sent.requires_grad());
      at::Tensor x = values(0.2, n).set_requires_grad(true);
      WaitHandle handle = isend(comm, x, 1, 6);
      join_dummies(at::zeros({}, at::kDouble), {wait(handle)}).backward();
      EXPECT_TRUE(at::allclose(x.grad(), up)) << x.grad();
      return;
    }
    at::Tensor p = w.clone().set_requires_grad(true);
    at::Tensor y = wait(irecv(comm, 0, 6, {}, std::vector<int64_t>{n}, at::kDouble));
    EXPECT_TRUE(at::equal(y, at::ones({n}, at::kDouble)));
    expect_prompt_backward(p.mul(y).sum());
    EXPECT_TRUE(at::allclose(p.grad(), at::ones({n}, at::kDouble)));
    at::Tensor h = wait(irecv(comm, 0, 6, {}, std::vector<int64_t>{n}, at::kDouble));
    h.mul(up).sum().backward();
  });
  EXPECT_EQ(failures, "");
}

// Irecv / Wait on the receiving side; on the sending side the Wait's output is used in the loss
// too, so dL/dx = (its own use) + (the peer's gradient).
TEST(WaitHandleTest, IsendIrecvWaitCarryGradientsBothWays) {
  const int64_t n = 6;
  at::Tensor v = values(0.3, n).add(1), w = values(0.8, n).sub(2);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    if (rank == 0) {
      at::Tensor x = values(0.5, n).set_requires_grad(true);
      WaitHandle handle = isend(comm, x.mul(3), 1, 7);
      at::Tensor sent = wait(handle);
      sent.mul(v).sum().backward();
      EXPECT_TRUE(at::allclose(x.grad(), v.add(w).mul(3))) << x.grad();
    } else {
      WaitHandle handle = irecv(comm, 0, 7, {}, std::vector<int64_t>{n}, at::kDouble);
      WaitHandle joined = join_dummies_handle(handle, {at::zeros({}).set_requires_grad(true)});
      at::Tensor y = wait(joined);
      EXPECT_TRUE(at::allclose(y, values(0.5, n).mul(3)));
      y.mul(w).sum().backward();
    }
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace cohort::autograd
