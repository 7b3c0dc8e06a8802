#pragma once

// The seam between libtorch tensors and the communicator's raw buffers, shared by every
// differentiable op of worker/autograd: dtype mapping, the one Status → exception conversion,
// argument checks, and how an autograd context remembers its communicator.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/autograd/tensor_header.h"
#include "worker/base/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/types.h"

namespace cohort::autograd {

// The reverse (gradient) transfer of a tag t uses t | kGradientTagBit so it can never match a
// forward message (the communicator allows tags < 2^29). User tags of send/recv/isend/irecv are
// at most kMaxUserTag (tensor_header.h: the bits between carry headers and monitored_barrier).
inline constexpr uint32_t kGradientTagBit = 1u << 28;

// kHalf→kFloat16, kBFloat16, kFloat→kFloat32, kDouble→kFloat64, kChar→kInt8, kByte→kUInt8,
// kInt→kInt32, kLong→kInt64; anything else throws std::runtime_error.
comm::DataType to_data_type(at::ScalarType type);

// The one conversion from cohort's error model to C++ exceptions: throws std::runtime_error
// carrying `context` and the Status text when `status` is not OK.
void throw_if_error(const Status& status, const std::string& context);

// Waits for `work` (it completes within its own deadline) and throws on failure.
void wait_or_throw(const std::shared_ptr<comm::Work>& work, const std::string& context);

// A contiguous tensor with the data of `x`, on x's device (no copy when it already is one).
// CPU and CUDA tensors are accepted; throws for undefined tensors and other devices.
at::Tensor contiguous_for_comm(const at::Tensor& x, const char* op);

// Call right before the communicator reads or writes `t`'s memory. For a CUDA tensor: waits
// until every kernel queued on its device has finished, on any stream (torch::cuda::synchronize).
// The communicator orders its device work after the legacy default stream only, while torch may
// have produced (or still be reading) `t` on another stream. A no-op for CPU tensors.
void sync_before_comm(const at::Tensor& t);

// True when gradients can flow through a tensor of this type (floating point).
bool is_differentiable(at::ScalarType type);

// Throws a clear error when `x` requires grad but has an integer dtype (libtorch normally
// refuses this already; the check keeps our ops' contract explicit).
void check_gradient_dtype(const at::Tensor& x, const char* op);

// A 0-dim tensor of `options` that requires grad: the input that keeps a rank's backward alive
// when it contributes no differentiable data (non-root bcast/scatter, recv without delegate).
// Anchors live on the device of the result they stand beside, so graphs never mix devices.
at::Tensor make_anchor(const at::TensorOptions& options);

// A 0-dim float tensor on `device` that does not require grad: the input of such a node when no
// gradient can flow (libtorch's custom functions cannot take undefined tensor inputs), so no
// graph is built.
at::Tensor make_inert_anchor(at::Device device = at::kCPU);

// Stores / loads the communicator in an autograd context. The communicator must outlive every
// graph built over it (backward runs communication on it).
void save_communicator(torch::autograd::AutogradContext* ctx, comm::Communicator* comm);
comm::Communicator& load_communicator(torch::autograd::AutogradContext* ctx);

// Point-to-point argument checks: peer in range and not this rank (a send to oneself would wait
// forever for a matching receive), tag at most kMaxUserTag.
void check_peer(const comm::Communicator& comm, int peer, uint32_t tag, const char* op);

// The input of a recv/irecv node: `delegate` when it requires grad, else a fresh anchor (when
// grad mode is on and `dtype` is floating), else an inert anchor; anchors on `device`, the received
// tensor's. Throws when an integer receive is given a delegate (no gradient could flow back
// through it).
at::Tensor recv_anchor(const at::Tensor& delegate, at::ScalarType dtype, at::Device device, int peer,
                       uint32_t tag, const char* op);

// The dtype and shape of a tensor as a string, and back: for ops whose non-root ranks learn
// the shape from the root (bcast, scatter) through Communicator::bcast_obj.
std::string encode_meta(at::ScalarType type, at::IntArrayRef shape);
void decode_meta(const std::string& meta, at::ScalarType* type, std::vector<int64_t>* shape);

}  // namespace cohort::autograd
