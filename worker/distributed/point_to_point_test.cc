// Point to point of process_group.h with ranks as threads over the loopback transport: shape
// exchange, in-place receives into non-contiguous tensors, mismatch errors naming both sides,
// isend / irecv Works, batch_isend_irecv rings, tags.

#include "worker/distributed/point_to_point.h"

#include <chrono>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "worker/autograd/point_to_point_functions.h"
#include "worker/autograd/testing/autograd_ranks.h"
#include "worker/distributed/testing/expect_tensor.h"

namespace cohort::distributed {
namespace {

using autograd::testing::run_autograd_ranks;
using testing::error_of;
using testing::expect_contains;
using testing::expect_equal;
using namespace std::chrono_literals;

TEST(PointToPointTest, RecvWithoutAShapeGetsTheSendersShapeAndDtype) {
  EXPECT_EQ(run_autograd_ranks(
                2,
                [](int rank, comm::Communicator& comm) {
                  at::Tensor sent = at::arange(24, at::kLong).reshape({2, 3, 4});
                  if (rank == 0) {
                    send(comm, sent.transpose(0, 2), 1, /*tag=*/7);  // non-contiguous
                    send(comm, at::empty({0, 5}, at::kHalf), 1);
                  } else {
                    expect_equal(recv(comm, 0, 7), sent.transpose(0, 2), "recv");
                    at::Tensor empty = recv(comm, 0);
                    if (empty.sizes() != at::IntArrayRef({0, 5}) || empty.scalar_type() != at::kHalf) {
                      throw std::runtime_error("the empty tensor lost its shape or dtype");
                    }
                  }
                }),
            "");
}

// One header format for both tensor APIs (worker/autograd/tensor_header.h): what this API sends,
// worker/autograd's recv takes without a shape or dtype, and what autograd's send sends (here an
// integer tensor: no gradient transfer follows), this API's recv takes.
TEST(PointToPointTest, TheAutogradOpsShareTheHeader) {
  EXPECT_EQ(run_autograd_ranks(
                2,
                [](int rank, comm::Communicator& comm) {
                  at::Tensor a = at::arange(12, at::kDouble).reshape({3, 4});
                  at::Tensor b = at::arange(5, at::kInt);
                  if (rank == 0) {
                    send(comm, a, 1, 4);
                    // The autograd side without a gradient (an integer tensor): no backward transfer.
                    autograd::send(comm, b, 1, 4);
                  } else {
                    at::NoGradGuard no_grad;
                    at::Tensor got_a = autograd::recv(comm, 0, 4);
                    expect_equal(got_a, a, "autograd::recv of distributed::send");
                    expect_equal(recv(comm, 0, 4), b, "distributed::recv of autograd::send");
                  }
                }),
            "");
}

TEST(PointToPointTest, RecvIntoANonContiguousTensorOfAnotherShape) {
  EXPECT_EQ(
      run_autograd_ranks(2,
                         [](int rank, comm::Communicator& comm) {
                           if (rank == 0) {
                             send(comm, at::arange(6, at::kFloat), 1);
                           } else {
                             at::Tensor into = at::zeros({3, 2}).t();  // [2, 3], non-contiguous
                             recv(comm, into, 0);
                             expect_equal(into, at::arange(6, at::kFloat).reshape({2, 3}), "recv in place");
                           }
                         }),
      "");
}

TEST(PointToPointTest, AMismatchedReceiveNamesWhatWasSentAndWhatWasPosted) {
  EXPECT_EQ(
      run_autograd_ranks(
          2,
          [](int rank, comm::Communicator& comm) {
            if (rank == 0) {
              // The receiver fails on the header, so the data is never taken.
              auto work = isend(comm, at::ones({4}, at::kFloat), 1, 0, {.async_op = false, .timeout = 500ms});
              try {
                work->wait();
              } catch (const std::exception&) {
              }
            } else {
              at::Tensor wrong = at::zeros({5}, at::kDouble);
              std::string error = error_of(
                  [&] { recv(comm, wrong, 0, 0, {.async_op = false, .timeout = 500ms}); }, "mismatch");
              expect_contains(error, "the sender sent Float [4] but this rank posted Double [5]", "error");
              expect_contains(error, "recv from rank 0 (tag 0)", "error");
            }
          }),
      "");
}

TEST(PointToPointTest, IsendIrecvWorksCompleteAndTagsKeepMessagesApart) {
  EXPECT_EQ(run_autograd_ranks(2,
                               [](int rank, comm::Communicator& comm) {
                                 if (rank == 0) {
                                   auto a = isend(comm, at::full({3}, 1.0), 1, /*tag=*/1);
                                   auto b = isend(comm, at::full({3}, 2.0), 1, /*tag=*/2);
                                   a->wait();
                                   b->wait();
                                 } else {
                                   at::Tensor two = at::zeros({3}), one = at::zeros({3});
                                   auto b = irecv(comm, two, 0, 2);  // posted in the other order
                                   auto a = irecv(comm, one, 0, 1);
                                   a->wait(5s);
                                   b->wait(5s);
                                   if (!a->is_completed() || !b->is_success())
                                     throw std::runtime_error("not done");
                                   expect_equal(one, at::full({3}, 1.0), "tag 1");
                                   expect_equal(two, at::full({3}, 2.0), "tag 2");
                                 }
                                 expect_contains(
                                     error_of([&] { send(comm, at::ones({1}), 1 - rank, kMaxTag + 1); },
                                              "reserved tag"),
                                     "are reserved", "tag");
                               }),
            "");
}

TEST(PointToPointTest, BatchIsendIrecvRingOnEverySize) {
  for (int size : {2, 3, 5, 8}) {
    EXPECT_EQ(run_autograd_ranks(size,
                                 [size](int rank, comm::Communicator& comm) {
                                   const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
                                   at::Tensor out = at::full({2, 2}, rank * 1.0), in = at::zeros({2, 2});
                                   auto works = batch_isend_irecv(comm, {{P2POp::Kind::kIsend, out, next},
                                                                         {P2POp::Kind::kIrecv, in, prev}});
                                   for (auto& work : works) work->wait();
                                   expect_equal(in, at::full({2, 2}, prev * 1.0), "ring");
                                 }),
              "")
        << "size " << size;
  }
}

TEST(PointToPointTest, ASilentPeerIsATimeoutNamingTheCall) {
  EXPECT_EQ(run_autograd_ranks(
                2,
                [](int rank, comm::Communicator& comm) {
                  if (rank == 1) return;
                  std::string error = error_of(
                      [&] { recv(comm, 1, 3, at::kCPU, {.async_op = false, .timeout = 200ms}); }, "silent");
                  expect_contains(error, "recv from rank 1 (tag 3)", "error");
                }),
            "");
}

}  // namespace
}  // namespace cohort::distributed
