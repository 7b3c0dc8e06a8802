#include "worker/autograd/tensor_header.h"

#include <fmt/format.h>

namespace cohort::autograd {
namespace {

// "cohort\0\2": tells a header from a buffer the sender never filled. The last byte is the
// format's version: 2 added the flags word (a version-1 header would read a 13th size as flags).
constexpr int64_t kHeaderMagic = 0x636f686f72740002;

constexpr int kFlagsWord = kHeaderWords - 1;
// Flags: the sender's tensor requires grad (its backward receives the gradient).
constexpr int64_t kRequiresGradFlag = 1;
constexpr int64_t kKnownFlags = kRequiresGradFlag;

}  // namespace

StatusOr<TensorHeader> make_tensor_header(c10::ScalarType type, c10::IntArrayRef shape, bool requires_grad) {
  if (shape.size() > static_cast<size_t>(kMaxHeaderDims)) {
    return invalid_argument_error(
        "tensors of more than {} dimensions cannot be sent (got {}); reshape it first", kMaxHeaderDims,
        shape.size());
  }
  TensorHeader header;
  header.fill(0);
  header[0] = kHeaderMagic;
  header[1] = static_cast<int64_t>(type);
  header[2] = static_cast<int64_t>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) header[3 + d] = shape[d];
  header[kFlagsWord] = requires_grad ? kRequiresGradFlag : 0;
  return header;
}

bool is_tensor_header(const TensorHeader& header) { return header[0] == kHeaderMagic; }

Status parse_tensor_header(const TensorHeader& header, c10::ScalarType* type, std::vector<int64_t>* shape,
                           bool* requires_grad) {
  const int64_t dims = header[2];
  if (header[0] != kHeaderMagic || dims < 0 || dims > kMaxHeaderDims || header[1] < 0 ||
      header[1] >= static_cast<int64_t>(c10::ScalarType::NumOptions) ||
      (header[kFlagsWord] & ~kKnownFlags) != 0) {
    return invalid_argument_error(
        "the message header is malformed: the sender is not using cohort's send / isend "
        "(worker/distributed or worker/autograd) with this tag, or runs another cohort version (every rank "
        "must run the same build)");
  }
  for (int64_t d = 0; d < dims; ++d) {
    if (header[3 + d] < 0) return invalid_argument_error("the message header announces a negative size");
  }
  *type = static_cast<c10::ScalarType>(header[1]);
  shape->assign(header.begin() + 3, header.begin() + 3 + dims);
  if (requires_grad != nullptr) *requires_grad = (header[kFlagsWord] & kRequiresGradFlag) != 0;
  return ok_status();
}

std::string describe_tensor(c10::ScalarType type, c10::IntArrayRef shape) {
  return fmt::format("{} [{}]", c10::toString(type), fmt::join(shape, ", "));
}

}  // namespace cohort::autograd
