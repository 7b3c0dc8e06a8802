#pragma once

// Differentiable point-to-point communication (ChainerMN's send / recv / pseudo_connect) and
// the pass-through joins that keep a rank's autograd graph connected.
//
// Model parallelism across two ranks (ChainerMN's Model_0 / Model_1):
//
//   // rank 0                                        // rank 1
//   at::Tensor h = layer0(x);                          at::Tensor h = autograd::recv(*comm, 0, 0);
//   at::Tensor phi = autograd::send(*comm, h, 1, 0);   layer1(h).sum().backward();  // sends dL/dh to 0
//   phi.backward();   // receives dL/dh from rank 1
//
// The shape and dtype travel with the data (as in ChainerMN): every send is preceded by a small
// header (tensor_header.h, the wire format worker/distributed's send / recv use too), so recv
// needs neither; a recv that names them checks them against the header.
//
// `send` returns a delegate variable: a 0-dim tensor whose backward receives the gradient of the
// sent tensor. A rank's backward must reach every delegate it created, or the peer blocks until
// its timeout: call delegate.backward(), pass it to the next recv as `delegate`, or join it into
// the loss with pseudo_connect / join_dummies.
//
// Blocking: send/recv return once the transfer completed on this rank; their backward transfers
// block the same way. Tags must be at most kMaxUserTag (headers use tag | kHeaderTagBit, the
// gradient tag | kGradientTagBit).
// Errors throw std::runtime_error. The communicator must outlive the graphs built over it.

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "worker/comm/communicator.h"

namespace cohort::autograd {

// Sends x's header (dtype, shape, and whether x requires grad), then x (CPU or CUDA), to `peer`;
// returns the delegate, on x's device. Backward: receives dL/dx from `peer`. When x does not
// require grad (or grad mode is off) there is no backward: the delegate does not require grad,
// and the receiver sends no gradient. Sending to oneself is an error, and so is a tensor of more
// than kMaxHeaderDims dimensions.
at::Tensor send(comm::Communicator& comm, const at::Tensor& x, int peer, uint32_t tag = 0);

// Receives the tensor `peer` sent into a new tensor on `device` (the sender's device may
// differ). Without `shape` and `dtype` (ChainerMN's recv) they are the sender's, from its
// header; given, the dtype must equal the sender's and the shape hold as many elements (the
// result takes the given shape), else the data is received and dropped and the call throws
// naming both. `delegate` (may be undefined, on any device) is an earlier delegate / dummy this
// recv must follow in backward; without one (or with one that does not require grad, which has
// no backward to follow), a fresh anchor on `device` keeps the backward alive. Backward: sends
// dL/dy to `peer`, zero to the delegate. When the sender's tensor did not require grad no
// gradient goes back (as in torch): the result requires grad only through a delegate, and its
// backward just passes the delegate its zero.
at::Tensor recv(comm::Communicator& comm, int peer, uint32_t tag = 0, const at::Tensor& delegate = {},
                const std::optional<std::vector<int64_t>>& shape = std::nullopt,
                std::optional<at::ScalarType> dtype = std::nullopt, at::Device device = at::kCPU);

// Returns `actual` unchanged (as new graph nodes) with `delegate` attached: backward passes the
// gradient of the result to `actual` and a zero gradient to `delegate` (on the delegate's
// device, which may differ from actual's), so the delegate's backward (e.g. a send's gradient
// receive) runs as part of the same backward pass.
at::Tensor pseudo_connect(const at::Tensor& delegate, const at::Tensor& actual);
std::vector<at::Tensor> pseudo_connect(const at::Tensor& delegate, at::TensorList actuals);

// mpi4torch's JoinDummies: returns x, with every tensor of `dummies` as an extra input that gets
// a zero gradient. Orders operations through the graph without changing values.
at::Tensor join_dummies(const at::Tensor& x, at::TensorList dummies);

}  // namespace cohort::autograd
