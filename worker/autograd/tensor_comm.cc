#include "worker/autograd/tensor_comm.h"

#include <sstream>
#include <stdexcept>

#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/cuda.h>

#include "worker/comm/transport/nccl/device_memory.h"

namespace cohort::autograd {
namespace {

// Holds the communicator pointer inside an IValue (saved_data only stores IValues).
struct CommunicatorRef : torch::CustomClassHolder {
  explicit CommunicatorRef(comm::Communicator* c) : comm(c) {}
  comm::Communicator* comm;
};

constexpr const char* kCommunicatorKey = "cohort_communicator";

}  // namespace

comm::DataType to_data_type(at::ScalarType type) {
  switch (type) {
    case at::kHalf:
      return comm::DataType::kFloat16;
    case at::kBFloat16:
      return comm::DataType::kBFloat16;
    case at::kFloat:
      return comm::DataType::kFloat32;
    case at::kDouble:
      return comm::DataType::kFloat64;
    case at::kChar:
      return comm::DataType::kInt8;
    case at::kByte:
      return comm::DataType::kUInt8;
    case at::kInt:
      return comm::DataType::kInt32;
    case at::kLong:
      return comm::DataType::kInt64;
    default:
      throw std::runtime_error(fmt::format(
          "cohort autograd: tensors of dtype {} cannot be communicated; use one of Half, BFloat16, Float, "
          "Double, Char, Byte, Int, Long",
          c10::toString(type)));
  }
}

void throw_if_error(const Status& status, const std::string& context) {
  if (!status.ok())
    throw std::runtime_error(fmt::format("cohort autograd: {}: {}", context, status.to_string()));
}

void wait_or_throw(const std::shared_ptr<comm::Work>& work, const std::string& context) {
  throw_if_error(work->wait(), context);
}

at::Tensor contiguous_for_comm(const at::Tensor& x, const char* op) {
  if (!x.defined()) throw std::runtime_error(fmt::format("cohort autograd: {}: the tensor is undefined", op));
  if (!x.device().is_cpu() && !x.device().is_cuda()) {
    throw std::runtime_error(
        fmt::format("cohort autograd: {}: only CPU and CUDA tensors can be communicated, got one on {}", op,
                    x.device().str()));
  }
  if (x.is_cuda() && !comm::cuda_build()) {
    // Without --config=cuda the communicators cannot tell device pointers from host ones.
    throw std::runtime_error(fmt::format(
        "cohort autograd: {}: a CUDA tensor needs cohort built with --config=cuda (bazel build --config=cuda "
        "--repo_env=COHORT_LIBTORCH=<a CUDA libtorch> ...); this build's communicators read host memory only",
        op));
  }
  return x.contiguous();
}

void sync_before_comm(const at::Tensor& t) {
  if (t.defined() && t.is_cuda()) torch::cuda::synchronize(t.device().index());
}

bool is_differentiable(at::ScalarType type) { return at::isFloatingType(type); }

void check_gradient_dtype(const at::Tensor& x, const char* op) {
  if (x.defined() && x.requires_grad() && !is_differentiable(x.scalar_type())) {
    throw std::runtime_error(fmt::format(
        "cohort autograd: {}: a tensor of integer dtype {} cannot require grad; integer tensors are "
        "communicated without gradients (call .detach() or use a floating dtype)",
        op, c10::toString(x.scalar_type())));
  }
}

at::Tensor make_anchor(const at::TensorOptions& options) {
  return at::zeros({}, options.requires_grad(false)).set_requires_grad(true);
}

at::Tensor make_inert_anchor(at::Device device) { return at::zeros({}, at::TensorOptions(device)); }

void save_communicator(torch::autograd::AutogradContext* ctx, comm::Communicator* comm) {
  ctx->saved_data[kCommunicatorKey] = at::IValue::make_capsule(c10::make_intrusive<CommunicatorRef>(comm));
}

comm::Communicator& load_communicator(torch::autograd::AutogradContext* ctx) {
  auto holder = ctx->saved_data.at(kCommunicatorKey).toCapsule();
  return *static_cast<CommunicatorRef*>(holder.get())->comm;
}

void check_peer(const comm::Communicator& comm, int peer, uint32_t tag, const char* op) {
  if (peer < 0 || peer >= comm.size()) {
    throw std::runtime_error(
        fmt::format("cohort autograd: {}: peer {} is outside {}", op, peer, comm.description()));
  }
  if (peer == comm.rank()) {
    throw std::runtime_error(fmt::format(
        "cohort autograd: {}: peer {} is this rank ({}); point-to-point to oneself would never complete — "
        "use the tensor directly",
        op, peer, comm.description()));
  }
  if (tag > kMaxUserTag) {
    throw std::runtime_error(
        fmt::format("cohort autograd: {}: tag {} exceeds the maximum {} (higher tags carry headers and gradients)",
                    op, tag, kMaxUserTag));
  }
}

at::Tensor recv_anchor(const at::Tensor& delegate, at::ScalarType dtype, at::Device device, int peer,
                       uint32_t tag, const char* op) {
  if (!is_differentiable(dtype)) {
    if (delegate.defined() && delegate.requires_grad()) {
      throw std::runtime_error(
          fmt::format("cohort autograd: {} from rank {} (tag {}): a receive of integer dtype {} carries no "
                      "gradient, so it "
                      "cannot take a delegate; join the delegate elsewhere (pseudo_connect)",
                      op, peer, tag, c10::toString(dtype)));
    }
    return make_inert_anchor(device);
  }
  // A delegate without grad (the send of a tensor that did not require grad, a frozen stage's)
  // has no backward to order; taken as the input it would leave this receive out of the graph,
  // and the sender of a tensor that does require grad would wait for its gradient in vain.
  if (delegate.defined() && delegate.requires_grad()) return delegate;
  if (!c10::GradMode::is_enabled()) return make_inert_anchor(device);
  return make_anchor(at::TensorOptions(dtype).device(device));
}

std::string encode_meta(at::ScalarType type, at::IntArrayRef shape) {
  std::string out = std::to_string(static_cast<int>(type));
  for (int64_t d : shape) out += " " + std::to_string(d);
  return out;
}

void decode_meta(const std::string& meta, at::ScalarType* type, std::vector<int64_t>* shape) {
  std::istringstream in(meta);
  int t = 0;
  in >> t;
  *type = static_cast<at::ScalarType>(t);
  shape->clear();
  int64_t d = 0;
  while (in >> d) shape->push_back(d);
}

}  // namespace cohort::autograd
