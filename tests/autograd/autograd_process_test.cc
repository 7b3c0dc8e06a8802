// The autograd ops with ranks as real processes over UCX on 127.0.0.1, bootstrapped through a
// TcpStore served by the test on an ephemeral port. Each child computes a single-process
// reference with plain libtorch ops on every rank's (deterministic) input, runs the op over the
// communicator with a non-uniform upstream gradient, and compares its output and gradient.
// The parent never touches libtorch, so forking does not copy its thread pools half-initialised.

#include <stdlib.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "worker/autograd/testing/test_tensors.h"

#include "daemon/agent/free_port.h"
#include "tests/comm/process_ranks.h"
#include "worker/autograd/comm_world.h"
#include "worker/autograd/collective_functions.h"
#include "worker/autograd/point_to_point_functions.h"
#include "worker/autograd/wait_handle.h"
#include "worker/comm/bootstrap.h"
#include "worker/comm/store/tcp_store.h"
#include "worker/comm/store/tcp_store_server.h"

namespace cohort::autograd {
namespace {

using comm::Communicator;
using comm::Duration;
using comm::testing::failed_ranks;
using comm::testing::ProcessRanks;
using std::chrono::seconds;
using Tensors = std::vector<at::Tensor>;

// Sizes where every op is meaningful across processes (size 1 is covered by the thread level).
constexpr int kSizes[] = {2, 3, 4};
// The whole run of one multi-process case; children left past it are SIGKILLed.
constexpr Duration kTestDeadline = seconds(120);
// Store connection and world bootstrap of each child.
constexpr Duration kBootstrapTimeout = seconds(30);
// Per operation: a broken case fails well before kTestDeadline instead of running into it.
constexpr Duration kOpTimeout = seconds(30);

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/cohort-autograd-test-XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

using autograd::testing::data;
using autograd::testing::numel_of;
using autograd::testing::upstream;

std::string text_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t;
  return out.str();
}

Status expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (!got.defined()) return internal_error("{}: undefined, expected\n{}", what, text_of(want));
  if (got.sizes() != want.sizes() || !at::allclose(got, want)) {
    return internal_error("{}:\n{}\nexpected\n{}", what, text_of(got), text_of(want));
  }
  return ok_status();
}

// Runs `body`, turning an exception (the ops throw std::runtime_error) into a Status.
Status guarded(const std::function<Status()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return internal_error("threw: {}", e.what());
  }
}

struct GradCase {
  // The input of `rank`; undefined where the op takes none (non-root bcast).
  std::function<at::Tensor(int rank, int size)> input;
  std::function<at::Tensor(Communicator& comm, const at::Tensor& x)> op;
  // Every rank's output computed in one process with plain libtorch ops; undefined where the
  // op returns a delegate (non-root reduce / gather).
  std::function<Tensors(const Tensors& xs)> reference;
};

// On rank `rank` of `comm`: the single-process reference of sum_r sum(y_r * upstream_r), then the
// op with loss sum(y * upstream_rank); compares the output and dL/dx.
Status check_gradients(Communicator& comm, const GradCase& c) {
  const int rank = comm.rank(), size = comm.size();
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
  const at::Tensor& leaf = leaves[rank];
  at::Tensor expected_grad = !leaf.defined()         ? leaf
                             : leaf.grad().defined() ? leaf.grad()
                                                     : at::zeros_like(leaf);

  at::Tensor x = c.input(rank, size);
  if (x.defined()) x.set_requires_grad(true);
  at::Tensor y = c.op(comm, x);
  if (expected[rank].defined()) {
    COHORT_RETURN_IF_ERROR(
        expect_close(y, expected[rank].detach(), fmt::format("rank {} of {} output", rank, size)));
    y.mul(upstream(rank, y.sizes())).sum().backward();
  } else {
    // A delegate: 0-dim, and its backward still runs this rank's part of the reverse collective.
    if (!y.defined() || y.dim() != 0) {
      return internal_error("rank {} of {}: expected a 0-dim delegate, got {}", rank, size,
                            y.defined() ? text_of(y) : std::string("undefined"));
    }
    y.backward();
  }
  if (!x.defined()) return ok_status();
  return expect_close(x.grad(), expected_grad, fmt::format("rank {} of {} grad", rank, size));
}

Tensors same_for_all(const at::Tensor& y, size_t size) { return Tensors(size, y); }

GradCase allreduce_case(
    comm::ReduceOp op, std::function<at::Tensor(const at::Tensor&)> reduce_rows,
    std::function<at::Tensor(int, int)> input = [](int rank, int) {
      return data(rank, {2, 3});
    }) {
  return GradCase{
      input, [op](Communicator& comm, const at::Tensor& x) { return allreduce(comm, x, op); },
      [reduce_rows](const Tensors& xs) { return same_for_all(reduce_rows(at::stack(xs)), xs.size()); }};
}

class AutogradProcessTest : public ::testing::Test {
 protected:
  // Forks `size` ranks; each builds a flat communicator over UCX (per-op timeout `op_timeout`)
  // and runs body(comm). Returns "" when every rank succeeded, else one line per failed rank.
  // A fresh store per run keeps the UCX address keys of runs apart.
  std::string run_ranks(int size, const std::function<Status(Communicator& comm)>& body,
                        Duration op_timeout = kOpTimeout) {
    comm::TcpStoreServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    auto server = comm::TcpStoreServer::start(options);
    if (!server.ok()) return "store server: " + server.status().to_string();
    int port = (*server)->port();
    ProcessRanks ranks(dir_.path());
    ranks.fork_ranks(size, [&](int rank) -> Status {
      at::set_num_threads(1);  // 2-4 processes share the machine's cores
      COHORT_ASSIGN_OR_RETURN(std::unique_ptr<comm::TcpStore> store,
                              comm::TcpStore::connect("127.0.0.1", port, kBootstrapTimeout));
      comm::Bootstrap boot;
      boot.store = std::move(store);
      boot.rank = rank;
      boot.world_size = size;
      boot.node_id = "node0";
      COHORT_ASSIGN_OR_RETURN(auto world, comm::create_world(boot, kBootstrapTimeout));
      comm::CommunicatorOptions comm_options;
      comm_options.timeout = op_timeout;
      COHORT_ASSIGN_OR_RETURN(auto comm, comm::create_communicator("flat", world, comm_options));
      return guarded([&] { return body(*comm); });
    });
    return failed_ranks(ranks.wait_all(kTestDeadline));
  }

  void expect_all_sizes(const GradCase& c) {
    for (int size : kSizes) {
      EXPECT_EQ(run_ranks(size, [&](Communicator& comm) { return check_gradients(comm, c); }), "")
          << "size " << size;
    }
  }

  TempDir dir_;
};

TEST_F(AutogradProcessTest, AllreduceSum) {
  expect_all_sizes(allreduce_case(comm::ReduceOp::kSum, [](const at::Tensor& s) { return s.sum(0); }));
}

TEST_F(AutogradProcessTest, AllreduceMaxRoutesToTheExtremeAndSplitsTies) {
  auto distinct = allreduce_case(comm::ReduceOp::kMax, [](const at::Tensor& s) { return s.amax(0); });
  // Values in {0, 1, 2}: many elements tie across ranks; amax splits ties evenly too.
  auto ties = allreduce_case(
      comm::ReduceOp::kMax, [](const at::Tensor& s) { return s.amax(0); },
      [](int rank, int) {
        return at::arange(12, at::kDouble).add(rank).remainder(3).reshape({3, 4});
      });
  for (int size : kSizes) {
    EXPECT_EQ(run_ranks(size,
                        [&](Communicator& comm) {
                          COHORT_RETURN_IF_ERROR(check_gradients(comm, distinct));
                          return check_gradients(comm, ties);
                        }),
              "")
        << "size " << size;
  }
}

TEST_F(AutogradProcessTest, Allgather) {
  expect_all_sizes(GradCase{[](int rank, int) { return data(rank, {3}); },
                            [](Communicator& comm, const at::Tensor& x) { return allgather_stacked(comm, x); },
                            [](const Tensors& xs) { return same_for_all(at::stack(xs), xs.size()); }});
}

// ChainerMN's functions.allgather across processes: one tensor per rank with that rank's shape
// (rank r: r+1 rows), and rank r's gradient is the sum of every rank's upstream of result[r].
TEST_F(AutogradProcessTest, AllgatherWithShapesThatDifferPerRank) {
  for (int size : kSizes) {
    EXPECT_EQ(run_ranks(size,
                        [](Communicator& comm) -> Status {
                          const int rank = comm.rank(), size = comm.size();
                          at::Tensor x = data(rank, {rank + 1, 3}).set_requires_grad(true);
                          std::vector<at::Tensor> ys = allgather(comm, x);
                          if (static_cast<int>(ys.size()) != size) return internal_error("{} results", ys.size());
                          at::Tensor loss = at::zeros({}, at::kDouble);
                          for (int r = 0; r < size; ++r) {
                            COHORT_RETURN_IF_ERROR(expect_close(ys[r], data(r, {r + 1, 3}),
                                                                fmt::format("rank {} result {}", rank, r)));
                            loss = loss + ys[r].mul(upstream(rank * 5 + r, {r + 1, 3})).sum();
                          }
                          loss.backward();
                          at::Tensor want = at::zeros({rank + 1, 3}, at::kDouble);
                          for (int q = 0; q < size; ++q) want = want + upstream(q * 5 + rank, {rank + 1, 3});
                          return expect_close(x.grad(), want, fmt::format("rank {} grad", rank));
                        }),
              "")
        << "size " << size;
  }
}

TEST_F(AutogradProcessTest, BcastFromFirstAndLastRank) {
  for (int size : kSizes) {
    for (int root : {0, size - 1}) {
      GradCase c{[root](int rank, int) {
                   return rank == root ? data(rank, {3, 2}) : at::Tensor();
                 },
                 [root](Communicator& comm, const at::Tensor& x) { return bcast(comm, x, root); },
                 [root](const Tensors& xs) { return same_for_all(xs[root].mul(1), xs.size()); }};
      EXPECT_EQ(run_ranks(size, [&](Communicator& comm) { return check_gradients(comm, c); }), "")
          << "size " << size << " root " << root;
    }
  }
}

TEST_F(AutogradProcessTest, AllreduceAvg) {
  expect_all_sizes(allreduce_case(comm::ReduceOp::kAvg, [](const at::Tensor& s) { return s.mean(0); }));
}

// Element 0 is zero on rank 0 only; element 1 on ranks 0 and 1: a backward dividing the product
// by x would give NaN (or inf) there, while the product of the other ranks' values is exact.
TEST_F(AutogradProcessTest, AllreduceProductHandlesZeros) {
  expect_all_sizes(allreduce_case(
      comm::ReduceOp::kProduct, [](const at::Tensor& s) { return s.prod(0); },
      [](int rank, int) {
        at::Tensor x = data(rank, {5});
        if (rank == 0) x[0].fill_(0.0);
        if (rank <= 1) x[1].fill_(0.0);
        return x;
      }));
}

// Non-root ranks get a delegate and run its backward: every x.grad is root's upstream gradient.
TEST_F(AutogradProcessTest, ReduceToFirstAndLastRankWithDelegatesOffRoot) {
  for (int size : kSizes) {
    for (int root : {0, size - 1}) {
      GradCase c{[](int rank, int) { return data(rank, {2, 3}); },
                 [root](Communicator& comm, const at::Tensor& x) { return reduce(comm, x, root); },
                 [root](const Tensors& xs) {
                   Tensors ys(xs.size());
                   ys[root] = at::stack(xs).sum(0);
                   return ys;
                 }};
      EXPECT_EQ(run_ranks(size, [&](Communicator& comm) { return check_gradients(comm, c); }), "")
          << "size " << size << " root " << root;
    }
  }
}

// [size, *x.shape] at root, delegates elsewhere; rank r's x.grad is block r of root's upstream.
TEST_F(AutogradProcessTest, GatherToFirstAndLastRankWithDelegatesOffRoot) {
  for (int size : kSizes) {
    for (int root : {0, size - 1}) {
      GradCase c{[](int rank, int) { return data(rank, {2, 2}); },
                 [root](Communicator& comm, const at::Tensor& x) { return gather(comm, x, root); },
                 [root](const Tensors& xs) {
                   Tensors ys(xs.size());
                   ys[root] = at::stack(xs);
                   return ys;
                 }};
      EXPECT_EQ(run_ranks(size, [&](Communicator& comm) { return check_gradients(comm, c); }), "")
          << "size " << size << " root " << root;
    }
  }
}

// xs = [size, 3] at root only (non-root ranks pass an undefined tensor); rank r gets xs[r], and
// root's xs.grad stacks every rank's upstream gradient in rank order.
TEST_F(AutogradProcessTest, ScatterFromFirstAndLastRank) {
  for (int size : kSizes) {
    for (int root : {0, size - 1}) {
      GradCase c{[root](int rank, int n) { return rank == root ? data(rank, {n, 3}) : at::Tensor(); },
                 [root](Communicator& comm, const at::Tensor& x) { return scatter(comm, x, root); },
                 [root](const Tensors& xs) {
                   Tensors ys;
                   for (size_t r = 0; r < xs.size(); ++r) ys.push_back(xs[root][static_cast<int64_t>(r)]);
                   return ys;
                 }};
      EXPECT_EQ(run_ranks(size, [&](Communicator& comm) { return check_gradients(comm, c); }), "")
          << "size " << size << " root " << root;
    }
  }
}

// xs = [size, 2] on every rank; rank r gets sum_q xs_q[r]; xs.grad stacks every rank's upstream.
TEST_F(AutogradProcessTest, ReduceScatter) {
  expect_all_sizes(GradCase{[](int rank, int n) { return data(rank, {n, 2}); },
                            [](Communicator& comm, const at::Tensor& x) { return reduce_scatter(comm, x); },
                            [](const Tensors& xs) {
                              at::Tensor sum = at::stack(xs).sum(0);
                              Tensors ys;
                              for (size_t r = 0; r < xs.size(); ++r) ys.push_back(sum[static_cast<int64_t>(r)]);
                              return ys;
                            }});
}

// y_r[q] = xs_q[r] (a transpose of the rank and block dimensions); the gradient goes back the same way.
TEST_F(AutogradProcessTest, Alltoall) {
  expect_all_sizes(GradCase{[](int rank, int n) { return data(rank, {n, 2, 3}); },
                            [](Communicator& comm, const at::Tensor& x) { return alltoall(comm, x); },
                            [](const Tensors& xs) {
                              at::Tensor t = at::stack(xs).transpose(0, 1);
                              Tensors ys;
                              for (size_t r = 0; r < xs.size(); ++r) ys.push_back(t[static_cast<int64_t>(r)]);
                              return ys;
                            }});
}

at::Tensor values(double scale, int64_t n) { return at::arange(n, at::kDouble).mul(scale).add(0.25).sin(); }

// ChainerMN's Model_0 / Model_1: rank 0 runs the first layer and the loss, rank 1 the second;
// rank 0's recv takes the delegate of its send so one backward covers both transfers.
TEST_F(AutogradProcessTest, ModelParallelWithDelegateVariable) {
  EXPECT_EQ(run_ranks(2,
                      [](Communicator& comm) -> Status {
                        const int64_t n = 5;
                        at::Tensor x = values(0.3, n), w0 = values(0.7, n).add(1), w1 = values(1.1, n).sub(2),
                                   up = values(0.9, n).add(3);
                        if (comm.rank() == 0) {  // Model_0
                          at::Tensor p0 = w0.clone().set_requires_grad(true);
                          at::Tensor phi = send(comm, x.mul(p0), 1, 0);
                          at::Tensor y = recv(comm, 1, 1, phi, std::vector<int64_t>{n}, at::kDouble);
                          COHORT_RETURN_IF_ERROR(expect_close(y, x * w0 * w1, "Model_0 output"));
                          y.mul(up).sum().backward();
                          return expect_close(p0.grad(), up * w1 * x, "Model_0 grad");
                        }
                        at::Tensor p1 = w1.clone().set_requires_grad(true);  // Model_1
                        at::Tensor h = recv(comm, 0, 0, {}, std::vector<int64_t>{n}, at::kDouble);
                        at::Tensor phi = send(comm, h.mul(p1), 0, 1);
                        phi.backward();
                        return expect_close(p1.grad(), up * x * w0, "Model_1 grad");
                      }),
            "");
}

// mpi4torch's ring: Isend to the next rank, Recv from the previous one (ordered after the Isend
// through its dummy), Wait, and join the Wait's output into the result. With loss sum(res) every
// element of `a` reaches the loss twice, so a.grad == 2; with a non-uniform upstream u_r,
// a_r.grad == u_r + u_{r+1}.
Status ring(Communicator& comm, uint32_t tag, bool uniform) {
  const int rank = comm.rank(), size = comm.size();
  const int64_t n = 10;
  at::Tensor a = data(rank, {n}).set_requires_grad(true);
  WaitHandle handle = isend(comm, a, (rank + 1) % size, tag);
  at::Tensor b =
      recv(comm, (rank + size - 1) % size, tag, handle.dummy(), std::vector<int64_t>{n}, at::kDouble);
  at::Tensor sent = wait(handle);
  COHORT_RETURN_IF_ERROR(expect_close(b, data((rank + size - 1) % size, {n}), "ring recv"));
  at::Tensor res = join_dummies(a + b, {sent});
  if (uniform) {
    res.sum().backward();
    return expect_close(a.grad(), at::full({n}, 2.0, at::kDouble), "ring grad");
  }
  res.mul(upstream(rank, {n})).sum().backward();
  return expect_close(a.grad(), upstream(rank, {n}) + upstream((rank + 1) % size, {n}),
                      "ring grad (non-uniform)");
}

TEST_F(AutogradProcessTest, RingIsendRecvWaitGivesGradTwoWithJoinDummies) {
  for (int size : kSizes) {
    EXPECT_EQ(run_ranks(size,
                        [](Communicator& comm) {
                          COHORT_RETURN_IF_ERROR(ring(comm, 0, /*uniform=*/true));
                          return ring(comm, 1, /*uniform=*/false);
                        }),
              "")
        << "size " << size;
  }
}

// mpi4torch's documented JoinDummiesHandle ring (see worker/autograd/wait_handle_test.cc), with
// ChainerMN's recv that takes its shape and dtype from the sender: the Wait follows the Recv, so
// in backward each rank posts its gradient receive before sending the Recv's gradient.
TEST_F(AutogradProcessTest, Mpi4torchRingWithJoinDummiesHandleAndShapelessRecv) {
  for (int size : kSizes) {
    EXPECT_EQ(run_ranks(size,
                        [](Communicator& comm) -> Status {
                          const int rank = comm.rank(), size = comm.size();
                          const int64_t n = 9;
                          at::Tensor a = data(rank, {n}).set_requires_grad(true);
                          WaitHandle handle = isend(comm, a, (rank + 1) % size, 3);
                          at::Tensor b = recv(comm, (rank + size - 1) % size, 3, handle.dummy());
                          at::Tensor wait_ret = wait(join_dummies_handle(handle, {b}));
                          at::Tensor res = join_dummies(a + b, {wait_ret});
                          COHORT_RETURN_IF_ERROR(expect_close(b, data((rank + size - 1) % size, {n}), "recv"));
                          res.mul(upstream(rank, {n})).sum().backward();
                          return expect_close(a.grad(), upstream(rank, {n}) + upstream((rank + 1) % size, {n}),
                                              "ring grad");
                        }),
              "")
        << "size " << size;
  }
}

// Over UCX: a WaitHandle dropped before wait() cancels its posted receives (UCX takes an
// unmatched receive back without consuming a message), so the next message on the tag goes to
// the next receive instead of into the dropped handle's freed buffers.
TEST_F(AutogradProcessTest, AHandleDroppedBeforeWaitLeavesTheNextMessageToTheNextReceive) {
  EXPECT_EQ(run_ranks(2,
                      [](Communicator& comm) -> Status {
                        const int64_t n = 4096;
                        const at::Tensor x1 = data(0, {n}), x2 = data(1, {n});
                        if (comm.rank() == 1) {
                          WaitHandle dropped = irecv(comm, 0, 5, {}, std::vector<int64_t>{n}, at::kDouble);
                        }
                        COHORT_RETURN_IF_ERROR(comm.barrier()->wait());  // rank 0 sends after the drop
                        if (comm.rank() == 0) {
                          send(comm, x1, 1, 5);
                          send(comm, x2, 1, 5);
                          return ok_status();
                        }
                        COHORT_RETURN_IF_ERROR(expect_close(recv(comm, 0, 5), x1, "first recv"));
                        return expect_close(recv(comm, 0, 5), x2, "second recv");
                      }),
            "");
}

// Over UCX: a tensor sent without grad gets no gradient back, so the receiver's backward does not
// wait for a receive its sender never posts (it finishes well within the 10 s op timeout), and
// the gradient of the next send on the tag, which does require grad, arrives unchanged.
TEST_F(AutogradProcessTest, TensorSentWithoutGradGetsNoGradientBack) {
  EXPECT_EQ(run_ranks(
                2,
                [](Communicator& comm) -> Status {
                  const int64_t n = 4096;
                  const at::Tensor up = data(1, {n});
                  if (comm.rank() == 0) {
                    send(comm, at::ones({n}, at::kDouble), 1, 4);
                    at::Tensor x = data(0, {n}).set_requires_grad(true);
                    send(comm, x, 1, 4).backward();
                    return expect_close(x.grad(), up, "grad of the second send");
                  }
                  at::Tensor w = data(2, {n}).set_requires_grad(true);
                  at::Tensor y = recv(comm, 0, 4);
                  if (y.requires_grad()) return internal_error("a tensor sent without grad requires grad");
                  auto start = comm::Clock::now();
                  w.mul(y).sum().backward();
                  auto took = comm::Clock::now() - start;
                  if (took > seconds(2)) {
                    return internal_error("backward took {} ms",
                                          std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
                  }
                  COHORT_RETURN_IF_ERROR(expect_close(w.grad(), at::ones({n}, at::kDouble), "w grad"));
                  recv(comm, 0, 4).mul(up).sum().backward();
                  return ok_status();
                },
                seconds(10)),
            "");
}

// mpi4torch's COMM_WORLD: each process gets torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT) and nothing else; autograd::comm_world() builds the communicator from them, and
// the differentiable allreduce runs over it (mpi4torch's first example: res = comm.Allreduce(x,
// MPI.SUM), x.grad == size with loss sum(res)).
TEST_F(AutogradProcessTest, CommWorldFromTheEnvironment) {
  for (int size : {2, 3}) {
    StatusOr<int> port = agent::pick_free_port("127.0.0.1");
    ASSERT_TRUE(port.ok()) << port.status().to_string();
    ProcessRanks ranks(dir_.path());
    ranks.fork_ranks(size, [&](int rank) -> Status {
      at::set_num_threads(1);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(size).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(*port).c_str(), 1);
      return guarded([&]() -> Status {
        Communicator& comm = comm_world();
        if (&comm != &comm_world()) return internal_error("comm_world() built a second communicator");
        if (comm.rank() != rank || comm.size() != size || comm.kind() != "hierarchical") {
          return internal_error("rank {} of {} ({}), expected {} of {} (hierarchical)", comm.rank(), comm.size(),
                                comm.kind(), rank, size);
        }
        at::Tensor x = data(rank, {4}).set_requires_grad(true);
        at::Tensor res = allreduce(comm, x, comm::ReduceOp::kSum);
        at::Tensor want = data(0, {4});
        for (int r = 1; r < size; ++r) want = want + data(r, {4});
        COHORT_RETURN_IF_ERROR(expect_close(res, want, "allreduce over comm_world"));
        res.sum().backward();
        return expect_close(x.grad(), at::full({4}, double(size), at::kDouble), "grad");
      });
    });
    EXPECT_EQ(failed_ranks(ranks.wait_all(kTestDeadline)), "") << "size " << size;
  }
}

// A rank that never runs backward (but stays alive) makes the other's backward fail with a
// DEADLINE_EXCEEDED naming the op, within about twice the timeout, instead of hanging.
TEST_F(AutogradProcessTest, BackwardWhosePeerNeverRunsBackwardTimesOut) {
  constexpr Duration kTimeout = seconds(2);
  EXPECT_EQ(
      run_ranks(
          2,
          [&](Communicator& comm) -> Status {
            at::Tensor x = data(comm.rank(), {3}).set_requires_grad(true);
            at::Tensor y = allreduce(comm, x, comm::ReduceOp::kSum);
            if (comm.rank() == 1) {
              // Alive but silent: the peer must see a timeout, not a closed connection.
              std::this_thread::sleep_for(3 * kTimeout);
              return ok_status();
            }
            auto start = comm::Clock::now();
            std::string what;
            try {
              y.sum().backward();
              return internal_error("backward succeeded without the peer's backward");
            } catch (const std::exception& e) {
              what = e.what();
            }
            auto waited = comm::Clock::now() - start;
            if (what.find("DEADLINE_EXCEEDED") == std::string::npos)
              return internal_error("not a timeout: {}", what);
            if (what.find("allreduce") == std::string::npos && what.find("flight") == std::string::npos) {
              return internal_error("neither the op nor the flight recorder named: {}", what);
            }
            if (waited > 2 * kTimeout) {
              return internal_error("took {} ms",
                                    std::chrono::duration_cast<std::chrono::milliseconds>(waited).count());
            }
            return ok_status();
          },
          kTimeout),
      "");
}

}  // namespace
}  // namespace cohort::autograd
