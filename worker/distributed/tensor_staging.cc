#include "worker/distributed/tensor_staging.h"

#include <numeric>
#include <stdexcept>
#include <utility>

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "worker/autograd/tensor_comm.h"

namespace cohort::distributed::internal {

void fail(const std::string& op, const std::string& message) {
  throw std::runtime_error(fmt::format("cohort distributed: {}: {}", op, message));
}

StagedTensor::StagedTensor(const at::Tensor& tensor, const std::string& op) : tensor_(tensor) {
  if (!tensor.defined()) fail(op, "the tensor is undefined");
  dtype_ = autograd::to_data_type(tensor.scalar_type());
  // contiguous_for_comm checks the device (CPU, or CUDA in a CUDA build) and copies only when
  // the tensor is not contiguous.
  buffer_ = autograd::contiguous_for_comm(tensor, op.c_str());
  autograd::sync_before_comm(buffer_);
}

void StagedTensor::copy_back() const {
  // No graph: the call writes data, as torch.distributed does into a parameter that requires grad.
  at::NoGradGuard no_grad;
  if (staged()) tensor_.copy_(buffer_);
}

namespace {

void check_like(const at::Tensor& t, const at::Tensor& like, const std::string& op) {
  if (!t.defined()) fail(op, "a tensor of the list is undefined");
  if (t.scalar_type() != like.scalar_type() || t.device() != like.device()) {
    fail(op, fmt::format("every tensor must be {} on {} like the input, got {} on {}",
                         c10::toString(like.scalar_type()), like.device().str(),
                         c10::toString(t.scalar_type()), t.device().str()));
  }
}

}  // namespace

at::Tensor pack(const std::vector<at::Tensor>& list, const at::Tensor& like, const std::string& op) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : list) {
    check_like(t, like, op);
    flat.push_back(t.reshape({-1}));
  }
  if (flat.empty()) return at::empty({0}, like.options());
  at::Tensor out = at::cat(flat);
  autograd::sync_before_comm(out);
  return out;
}

at::Tensor flat_like(const std::vector<at::Tensor>& list, const at::Tensor& like, const std::string& op) {
  int64_t total = 0;
  for (const at::Tensor& t : list) {
    check_like(t, like, op);
    total += t.numel();
  }
  at::Tensor out = at::empty({total}, like.options());
  autograd::sync_before_comm(out);
  return out;
}

void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& list) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& t : list) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

std::vector<size_t> counts_of(const std::vector<at::Tensor>& list) {
  std::vector<size_t> counts;
  for (const at::Tensor& t : list) counts.push_back(static_cast<size_t>(t.numel()));
  return counts;
}

comm::CallOptions call_options(const OpOptions& options) {
  comm::CallOptions call;
  call.timeout = options.timeout;
  // A blocking call runs on this thread when nothing is queued (no executor hop).
  call.blocking = !options.async_op;
  return call;
}

std::shared_ptr<Work> launch(std::string op, const OpOptions& options,
                             std::vector<std::shared_ptr<comm::Work>> transfers, Work::Finish finish) {
  auto work = std::make_shared<Work>(std::move(op), std::move(transfers), std::move(finish));
  if (!options.async_op) work->wait();
  return work;
}

Work::Finish copy_back_all(std::vector<StagedTensor> staged) {
  return [staged = std::move(staged)](const Status& transfers) {
    if (transfers.ok()) {
      for (const StagedTensor& s : staged) s.copy_back();
    }
    return transfers;
  };
}

}  // namespace cohort::distributed::internal
