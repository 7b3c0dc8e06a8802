#include "worker/train/allreduce_persistent.h"

#include <exception>

#include <torch/csrc/autograd/grad_mode.h>

#include "worker/autograd/tensor_comm.h"

namespace cohort::train {

AllreducePersistent::AllreducePersistent(torch::nn::Module& module, comm::Communicator& comm)
    : module_(module), comm_(comm) {}

Status AllreducePersistent::operator()() {
  torch::NoGradGuard no_grad;
  for (const auto& item : module_.named_buffers(/*recurse=*/true)) {
    at::Tensor buffer = item.value();
    if (!buffer.defined() || !at::isFloatingType(buffer.scalar_type())) continue;
    comm::DataType dtype;
    at::Tensor data;
    try {
      dtype = autograd::to_data_type(buffer.scalar_type());
      data = autograd::contiguous_for_comm(buffer, "AllreducePersistent");
    } catch (const std::exception& e) {
      return invalid_argument_error("AllreducePersistent: buffer {}: {}", item.key(), e.what());
    }
    autograd::sync_before_comm(data);
    COHORT_RETURN_IF_ERROR(comm_
                               .allreduce(nullptr, data.data_ptr(), static_cast<size_t>(data.numel()), dtype,
                                          comm::ReduceOp::kAvg, comm::CallOptions{std::nullopt, true})
                               ->wait()
                               .with_context("AllreducePersistent: buffer " + item.key()));
    if (!data.is_same(buffer)) buffer.copy_(data);
  }
  return ok_status();
}

}  // namespace cohort::train
