// mpi4torch's JoinDummiesHandle (join_dummies_handle): the joined handle's Wait follows the
// dummies in the graph, so in backward the dummies' producers run only after the Wait's backward,
// and each dummy gets a zero gradient. Ranks are threads over the loopback transport; the
// documented ring runs over UCX processes in tests/autograd/autograd_process_test.cc.

#include "worker/autograd/wait_handle.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/SequenceNumber.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/autograd/point_to_point_functions.h"
#include "worker/autograd/testing/autograd_ranks.h"

namespace cohort::autograd {
namespace {

using testing::run_autograd_ranks;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor values(double scale, int64_t n) { return at::arange(n, at::kDouble).mul(scale).add(0.25).sin(); }

// The order in which Probe nodes ran their backward, per rank.
std::mutex log_mu;
std::vector<std::string> backward_log[8];

// Identity whose backward appends `name` to its rank's log.
struct Probe : torch::autograd::Function<Probe> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t rank, std::string name) {
    ctx->saved_data["rank"] = rank;
    ctx->saved_data["name"] = name;
    return x.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    std::lock_guard<std::mutex> lock(log_mu);
    backward_log[ctx->saved_data["rank"].toInt()].push_back(ctx->saved_data["name"].toStringRef());
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

at::Tensor probe(const at::Tensor& x, int rank, const std::string& name) {
  return Probe::apply(x, static_cast<int64_t>(rank), name);
}

// Rank 0 isends to rank 1, which irecvs: the handle of this rank's side.
WaitHandle exchange(comm::Communicator& comm, int rank, int64_t n) {
  if (rank == 0) return isend(comm, values(0.5, n).set_requires_grad(true), 1, 3);
  return irecv(comm, 0, 3, {}, std::vector<int64_t>{n}, at::kDouble);
}

// The dummy's producer is created where the engine would otherwise run it first: autograd's
// ready queue runs the node of the highest sequence number among those ready, and sequence
// numbers count per thread, so a node made on a thread that has counted far ahead outranks every
// node of the rank's thread. Joined into the handle, it still runs only after the Wait's
// backward (which it now follows in the graph); the loss reaches it directly too, so without the
// join it would run before.
TEST(JoinDummiesHandleTest, TheDummysBackwardFollowsTheWaitsBackward) {
  for (bool joined : {true, false}) {
    for (auto& log : backward_log) log.clear();
    std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
      at::Tensor w = values(0.9, 3).set_requires_grad(true);
      at::Tensor dummy;
      std::thread ahead([&] {
        for (int i = 0; i < (1 << 20); ++i) at::sequence_number::get_and_increment();
        dummy = probe(w, rank, "dummy");
      });
      ahead.join();
      WaitHandle handle = exchange(comm, rank, 4);
      if (joined) handle = join_dummies_handle(handle, {dummy});
      at::Tensor out = probe(wait(handle), rank, "wait output");
      at::Tensor loss = join_dummies(out.sum(), {dummy});
      loss.backward();
      ASSERT_TRUE(w.grad().defined());
      EXPECT_TRUE(at::equal(w.grad(), at::zeros({3}, at::kDouble))) << w.grad();
    });
    ASSERT_EQ(failures, "") << (joined ? "joined" : "not joined");
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<std::string> expected = joined ? std::vector<std::string>{"wait output", "dummy"}
                                                 : std::vector<std::string>{"dummy", "wait output"};
      EXPECT_EQ(backward_log[rank], expected) << "rank " << rank << (joined ? " joined" : " not joined");
    }
  }
}

// The joined handle carries the same transfer (values and gradients as without the join), its
// dummy is a new graph node whose inputs are the handle's dummy and the dummies, and dummies that
// reach the loss only through the join get exactly zero gradients (their backward runs: w.grad is
// defined).
TEST(JoinDummiesHandleTest, DummiesGetZeroGradientsAndTheTransferIsUnchanged) {
  const int64_t n = 5;
  at::Tensor up = values(1.7, n).add(1);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    at::Tensor w1 = values(0.3, 2).set_requires_grad(true), w2 = values(0.6, 3).set_requires_grad(true);
    at::Tensor d1 = w1.mul(4), d2 = w2.exp();
    at::Tensor x = values(0.5, n).set_requires_grad(true);
    WaitHandle handle = rank == 0 ? isend(comm, x.mul(2), 1, 9) : irecv(comm, 0, 9, {}, std::vector<int64_t>{n},
                                                                         at::kDouble);
    WaitHandle joined = join_dummies_handle(handle, {d1, d2});
    EXPECT_EQ(joined.state().get(), handle.state().get());
    ASSERT_NE(joined.dummy().grad_fn(), nullptr);
    EXPECT_NE(joined.dummy().grad_fn(), handle.dummy().grad_fn());
    std::vector<torch::autograd::Node*> inputs;
    for (const auto& edge : joined.dummy().grad_fn()->next_edges()) inputs.push_back(edge.function.get());
    for (const at::Tensor& t : {handle.dummy(), d1, d2}) {
      EXPECT_NE(std::find(inputs.begin(), inputs.end(), t.grad_fn().get()), inputs.end());
    }
    EXPECT_TRUE(at::equal(joined.dummy(), handle.dummy()));
    at::Tensor y = wait(joined);
    EXPECT_TRUE(at::allclose(y, values(0.5, n).mul(2)));
    if (rank == 0) {
      y.mul(0).sum().backward();
      EXPECT_TRUE(at::allclose(x.grad(), up.mul(2))) << x.grad();  // the peer's gradient came back
    } else {
      y.mul(up).sum().backward();
    }
    ASSERT_TRUE(w1.grad().defined());
    ASSERT_TRUE(w2.grad().defined());
    EXPECT_TRUE(at::equal(w1.grad(), at::zeros({2}, at::kDouble)));
    EXPECT_TRUE(at::equal(w2.grad(), at::zeros({3}, at::kDouble)));
  });
  EXPECT_EQ(failures, "");
}

// mpi4torch's documented use of JoinDummiesHandle, ported line by line:
//   handle = comm.Isend(a, (rank+1) % size, 0)
//   recvbuffer = mpi4torch.JoinDummies(torch.empty_like(a), [handle.dummy])
//   b = comm.Recv(recvbuffer, (rank-1+size) % size, 0)
//   wait_ret = comm.Wait(mpi4torch.JoinDummiesHandle(handle, [b]))
//   res = mpi4torch.JoinDummies(a + b, [wait_ret])
// The Wait follows the Recv, so in backward the Wait posts its gradient receive before the Recv
// sends its gradient: with a non-uniform upstream u_r, a_r.grad = u_r + u_{r+1}.
TEST(JoinDummiesHandleTest, Mpi4torchRingWithJoinDummiesHandle) {
  for (int size : {2, 3, 4, 5}) {
    std::string failures = run_autograd_ranks(size, [&](int rank, comm::Communicator& comm) {
      const int64_t n = 7;
      auto u = [n](int r) { return values(0.3 + r, n).add(2); };
      at::Tensor a = values(0.1 * (rank + 1), n).set_requires_grad(true);
      WaitHandle handle = isend(comm, a, (rank + 1) % size, 0);
      at::Tensor b = recv(comm, (rank + size - 1) % size, 0, handle.dummy());
      at::Tensor wait_ret = wait(join_dummies_handle(handle, {b}));
      at::Tensor res = join_dummies(a + b, {wait_ret});
      EXPECT_TRUE(at::allclose(b, values(0.1 * ((rank + size - 1) % size + 1), n)));
      res.mul(u(rank)).sum().backward();
      EXPECT_TRUE(at::allclose(a.grad(), u(rank) + u((rank + 1) % size))) << "rank " << rank << "\n" << a.grad();
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

// A handle dropped before wait() (an exception between irecv and wait) takes its receive with
// it: the transfers are cancelled before their buffers are freed, so the next message on the tag
// goes to the next receive (x1 here), not into the dropped handle's freed buffers, which would
// leave the receive after it x2.
TEST(WaitHandleTest, AHandleDroppedBeforeWaitLeavesTheNextMessageToTheNextReceive) {
  const int64_t n = 8;
  at::Tensor x1 = values(0.4, n), x2 = values(1.9, n);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    if (rank == 1) {
      WaitHandle dropped = irecv(comm, 0, 5, {}, std::vector<int64_t>{n}, at::kDouble);
      EXPECT_FALSE(dropped.state()->work->is_completed());
    }
    // Rank 0 sends only once rank 1's handle is gone.
    ASSERT_TRUE(comm.barrier()->wait().ok());
    if (rank == 0) {
      send(comm, x1, 1, 5);
      send(comm, x2, 1, 5);
      return;
    }
    EXPECT_TRUE(at::equal(recv(comm, 0, 5), x1));
    EXPECT_TRUE(at::equal(recv(comm, 0, 5), x2));
  });
  EXPECT_EQ(failures, "");
}

TEST(WaitHandleTest, AnIsendHandleDroppedBeforeItsReceiveStillDeliversItsTensor) {
  // The send goes on without its handle (the peer waits for it), reading the handle's own copy
  // of x, which must outlive the handle: memory freed with it is reused at once below.
  const int64_t n = 8;
  at::Tensor x = values(0.7, n);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    std::vector<at::Tensor> reuse;
    if (rank == 0) {
      {
        WaitHandle dropped = isend(comm, x, 1, 6);
        EXPECT_FALSE(dropped.state()->work->is_completed());
      }
      for (int i = 0; i < 64; ++i) reuse.push_back(at::full({n}, -5.0, at::kDouble));
    }
    // Rank 1 receives only once rank 0's handle is gone.
    ASSERT_TRUE(comm.barrier()->wait().ok());
    if (rank == 1) {
      EXPECT_TRUE(at::equal(recv(comm, 0, 6), x));
    }
    ASSERT_TRUE(comm.barrier()->wait().ok());
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace cohort::autograd
