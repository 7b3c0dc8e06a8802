#pragma once

// The header that precedes every point-to-point tensor of cohort's tensor APIs — worker/distributed's
// send / isend and worker/autograd's send / isend: the dtype and shape travel with the data, so a
// receiver may omit them (torch.distributed's recv without a shape, ChainerMN's recv without
// shape or dtype), and a receiver that names them gets an error naming both sides when they
// disagree instead of reading garbage. One wire format for both APIs: a tensor sent with either
// can be received with either, on the same tag.
//
// Wire: kHeaderWords int64 on tag `tag | kHeaderTagBit` before the data on `tag`; messages between
// two ranks with the same tag arrive in the order they were sent. The header costs one small
// extra message per send. It also says whether the sender's tensor requires grad (worker/autograd's
// send / isend of a tensor in a graph): only then does the receiver send a gradient back, since
// only then does the sender's backward post the gradient's receive. worker/distributed's sends
// never set it (torch.distributed has no backward).
//
// Tags of one communicator (all below the communicator's 2^29):
//   [0, kHeaderTagBit)                       user tags (both APIs)
//   tag | kHeaderTagBit  (bit 26)            headers
//   bit 27                                   worker/distributed's monitored_barrier
//   tag | kGradientTagBit (bit 28)           worker/autograd's gradients (tensor_comm.h)

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include "worker/base/status.h"

namespace cohort::autograd {

inline constexpr uint32_t kHeaderTagBit = 1u << 26;
// The largest user tag of point-to-point calls; the tags above are reserved (see the table above).
inline constexpr uint32_t kMaxUserTag = kHeaderTagBit - 1;
// A magic word, the at::ScalarType, the number of dims, the sizes, and last a flags word.
inline constexpr int kHeaderWords = 16;
inline constexpr int kMaxHeaderDims = kHeaderWords - 4;

using TensorHeader = std::array<int64_t, kHeaderWords>;

// The header of a tensor of `type` and `shape`; `requires_grad`: the sender's backward receives
// the tensor's gradient, so the receiver must send it. INVALID_ARGUMENT for more than
// kMaxHeaderDims dims.
StatusOr<TensorHeader> make_tensor_header(c10::ScalarType type, c10::IntArrayRef shape,
                                          bool requires_grad = false);

// A header whose magic word is set (one that arrived, rather than a buffer nobody filled).
bool is_tensor_header(const TensorHeader& header);

// The dtype and shape a received header announces, and (when `requires_grad` is not null)
// whether the sender waits for the gradient; INVALID_ARGUMENT for a malformed one.
Status parse_tensor_header(const TensorHeader& header, c10::ScalarType* type, std::vector<int64_t>* shape,
                           bool* requires_grad = nullptr);

// "Float [2, 3]": for errors naming what was sent and what was posted.
std::string describe_tensor(c10::ScalarType type, c10::IntArrayRef shape);

}  // namespace cohort::autograd
