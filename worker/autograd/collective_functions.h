#pragma once

// Differentiable collectives (ChainerMN's chainermn.functions) over a cohort Communicator.
// Every rank of `comm` must call the same op in the same order, in forward and — because each
// op's backward is itself a collective — in backward too. Ops that leave a rank without a
// meaningful output (non-root reduce / gather) return a delegate: a 0-dim tensor whose backward
// still runs that rank's part of the reverse collective; call backward() on it (or join it
// into the loss with pseudo_connect) so no rank's backward is skipped.
//
//   auto y = autograd::allreduce(*comm, x, comm::ReduceOp::kAvg);   // same y on every rank
//   y.mul(w).sum().backward();                                       // x.grad = allreduce(w)/size
//   std::vector<at::Tensor> ys = autograd::allgather(*comm, h);      // ys[r]: rank r's h
//
// Tensors: CPU or CUDA, any layout (made contiguous), dtypes Half/BFloat16/Float/Double
// (differentiable) and Char/Byte/Int/Long (communicated without gradients). Results, delegates
// and gradients are on the input's device; ranks may use different devices. Before the
// communicator touches a CUDA tensor the op waits for the device's queued kernels
// (sync_before_comm in tensor_comm.h). Blocking: each call returns when the collective finished
// on this rank. Errors throw std::runtime_error with the communicator's text. The communicator
// must outlive the graphs built over it.

#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "worker/comm/communicator.h"
#include "worker/comm/types.h"

namespace cohort::autograd {

// Same shape as x on every rank. Backward: SUM/AVG → allreduce SUM of the gradient (÷size for
// AVG); MAX/MIN → the summed gradient goes to the rank(s) holding the extreme, split evenly on
// ties; PRODUCT → summed gradient · product of the other ranks' values (exact where x has zeros).
at::Tensor allreduce(comm::Communicator& comm, const at::Tensor& x, comm::ReduceOp op = comm::ReduceOp::kSum);

// x at root; elsewhere only its device counts (x may be undefined): the shape and dtype come from
// root. Off root the result is on `device`, else on x's device when x is defined, else on a GPU
// when root's x is on one (the communicator's cuda_device(), else cuda:0), else on the CPU.
// Backward: reduce SUM of the gradients to root. Off root the output requires grad whenever grad
// mode is on and the dtype is floating, so that rank's backward takes part in the reduce.
at::Tensor bcast(comm::Communicator& comm, const at::Tensor& x, int root,
                 std::optional<at::Device> device = std::nullopt);

// SUM of x over ranks at root; a delegate elsewhere. Backward: bcast of root's gradient.
at::Tensor reduce(comm::Communicator& comm, const at::Tensor& x, int root);

// At root: [size, *x.shape] stacked in rank order; a delegate elsewhere. x has the same shape on
// every rank. Backward: scatter of root's gradient.
at::Tensor gather(comm::Communicator& comm, const at::Tensor& x, int root);

// xs at root: [size, ...]; rank r receives xs[r]. Elsewhere only xs's device counts (it may be
// undefined): the result's device is chosen as for bcast. Backward: gather of the gradients to root.
at::Tensor scatter(comm::Communicator& comm, const at::Tensor& xs, int root,
                   std::optional<at::Device> device = std::nullopt);

// ChainerMN's functions.allgather: one tensor per rank, in rank order (its tuple) — result[r] is
// rank r's x, with rank r's shape: shapes may differ per rank (even in their number of dims),
// dtypes must agree (else every rank throws naming them). Each result is its own tensor. One
// allgather of every rank's dtype and shape, then one allgatherv. Backward: every rank's gradient
// of result[r] goes to rank r, which sums them (one reduce_scatterv); unused results count as
// zero gradients.
std::vector<at::Tensor> allgather(comm::Communicator& comm, const at::Tensor& x);

// The stacked form: [size, *x.shape] on every rank, for an x of the same shape everywhere (one
// allgather, no shape exchange). Backward: reduce_scatter SUM of the gradient.
at::Tensor allgather_stacked(comm::Communicator& comm, const at::Tensor& x);

// xs: [size, ...]; returns SUM over ranks of xs[rank]. Backward: allgather of the gradient.
at::Tensor reduce_scatter(comm::Communicator& comm, const at::Tensor& xs);

// xs: [size, ...]; block r goes to rank r; returns [size, ...] with block r from rank r.
// Backward: alltoall of the gradient.
at::Tensor alltoall(comm::Communicator& comm, const at::Tensor& xs);

}  // namespace cohort::autograd
