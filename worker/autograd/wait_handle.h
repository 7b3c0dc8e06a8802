#pragma once

// Non-blocking differentiable point-to-point in mpi4torch's model: isend / irecv start a
// transfer and return a WaitHandle; wait(handle) completes it and returns the data. In backward
// the Wait node starts the reverse (gradient) transfer without blocking, and the isend / irecv
// node completes it — so a ring of Isend → Recv → Wait does not deadlock in backward either.
//
//   auto handle = autograd::isend(*comm, a, (rank + 1) % size, 0);
//   auto b = autograd::recv(*comm, (rank + size - 1) % size, 0, handle.dummy());
//   auto sent = autograd::wait(handle);
//   auto res = autograd::join_dummies(a + b, {sent});   // keeps the Wait in the graph
//   res.sum().backward();                                // a.grad == 2
//
// isend sends the same header as send (tensor_header.h), so recv and worker/distributed's recv
// can take it without a shape; irecv posts its buffer at once and so needs the shape and dtype,
// checked against the sender's header in wait().
//
// The Wait of every handle must be part of the backward graph (join its output into the loss
// with join_dummies); an isend / irecv node whose Wait was skipped fails in backward with an
// error naming the handle instead of hanging.

#include <cstdint>
#include <optional>
#include <vector>

#include <memory>
#include <string>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include "worker/autograd/tensor_header.h"
#include "worker/comm/communicator.h"

namespace cohort::autograd {

// The shared state of one transfer and its reverse, owned by its handle and its graph nodes.
// Internal to wait_handle.cc; used by one thread at a time: forward on the rank's thread, then
// backward (on the rank's thread for CPU tensors, on autograd's device thread for CUDA ones).
struct TransferState : torch::CustomClassHolder {
  // Dropped with transfers still posted (a handle dropped before wait(), an exception between
  // irecv and wait, a backward that failed before completing the reverse transfer): a receive's
  // Work is released before the buffer it writes, and a communicator receive released unfinished
  // is cancelled, so it takes no message from the next receive on its tag. An unfinished send
  // goes on (the peer waits for it) and keeps the buffers it reads until it completes.
  ~TransferState() override;

  comm::Communicator* comm = nullptr;
  bool is_send = false;
  int peer = 0;
  uint32_t tag = 0;
  std::vector<int64_t> shape;
  at::ScalarType type = at::kFloat;
  at::Device device = at::kCPU;            // of the buffers, the dummy and the gradient
  at::Tensor buffer;                       // the forward data until wait() hands it out
  std::shared_ptr<comm::Work> work;        // the forward transfer
  std::shared_ptr<TensorHeader> header;    // the forward transfer's header (sent, or being received)
  std::shared_ptr<comm::Work> header_work; // its transfer, completed in wait()
  bool waited = false;
  // Whether the reverse transfer happens. isend: x requires grad with grad mode on (the header
  // says so); irecv: the sender's header said its tensor requires grad (known once wait() read
  // it). Without it no gradient is sent (the sender would never receive it) or received.
  bool reverse = true;
  at::Tensor grad_buffer;                  // the reverse transfer's data
  std::shared_ptr<comm::Work> grad_work;   // the reverse transfer, posted by the Wait's backward
  at::Tensor wait_output_grad;             // isend: dL/d(wait output), added to dL/dx

  std::string describe() const {
    return fmt::format("{} rank {} (tag {})", is_send ? "isend to" : "irecv from", peer, tag);
  }
};

class WaitHandle {
 public:
  WaitHandle(at::Tensor dummy, c10::intrusive_ptr<TransferState> state);

  // A 0-dim tensor carrying the graph edge of the transfer: pass it to join_dummies or as a
  // recv delegate to order later operations after this one.
  const at::Tensor& dummy() const { return dummy_; }
  const c10::intrusive_ptr<TransferState>& state() const { return state_; }

 private:
  at::Tensor dummy_;
  c10::intrusive_ptr<TransferState> state_;
};

// Starts sending a copy of x (CPU or CUDA) to `peer` (x may be modified right after). Backward
// of the Wait posts the receive of dL/dx; this node's backward completes it. The dummy, the
// copy and the gradient are on x's device.
WaitHandle isend(comm::Communicator& comm, const at::Tensor& x, int peer, uint32_t tag = 0);

// Starts receiving a tensor of `shape` / `dtype` from `peer` (shape required: the receive is
// posted before the sender's header arrives) into a new tensor on `device` (the dummy goes there
// too); wait() checks them against the header (the dtype must match, the shape hold as many
// elements). `delegate` as for recv(). Backward of the Wait posts the send of dL/dy; this node's
// backward completes it. When the sender's tensor did not require grad (its header says so) no
// gradient is sent: the wait() output still requires grad when the anchor does (the graph is
// built before the header arrives), but its backward only passes zeros.
WaitHandle irecv(comm::Communicator& comm, int peer, uint32_t tag, const at::Tensor& delegate,
                 const std::optional<std::vector<int64_t>>& shape, at::ScalarType dtype = at::kFloat,
                 at::Device device = at::kCPU);

// Blocks until the transfer finished (within the communicator's timeout) and returns the sent
// tensor (isend) or the received one (irecv). Throws on failure. Call once per handle.
at::Tensor wait(const WaitHandle& handle);

// The same transfer with its dummy joined to `dummies`: the Wait then follows them too.
WaitHandle join_dummies_handle(const WaitHandle& handle, at::TensorList dummies);

}  // namespace cohort::autograd
