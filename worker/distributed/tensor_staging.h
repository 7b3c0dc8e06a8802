#pragma once

// The seam between the tensor-level API and the communicator's raw buffers: checks, the
// contiguous staging copy of a non-contiguous tensor (and the copy back), packing lists of
// tensors into one flat buffer, and starting a call as blocking or async_op. Internal to
// worker/distributed.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "worker/comm/communicator.h"
#include "worker/distributed/op_options.h"
#include "worker/distributed/work.h"

namespace cohort::distributed::internal {

// The contiguous memory the communicator reads or writes for one caller's tensor: the tensor
// itself when it is contiguous, else a contiguous copy (made at construction) whose result
// copy_back() writes into the tensor. CPU and CUDA tensors; a CUDA tensor's device is
// synchronized before its pointer goes to the communicator (see worker/autograd/tensor_comm.h).
class StagedTensor {
 public:
  // Throws std::runtime_error naming `op` for an undefined tensor, another device, or a dtype the
  // communicator cannot carry.
  StagedTensor(const at::Tensor& tensor, const std::string& op);

  void* data() const { return buffer_.numel() == 0 ? nullptr : buffer_.data_ptr(); }
  size_t count() const { return static_cast<size_t>(buffer_.numel()); }
  comm::DataType dtype() const { return dtype_; }
  const at::Tensor& tensor() const { return tensor_; }
  const at::Tensor& buffer() const { return buffer_; }
  bool staged() const { return !buffer_.is_same(tensor_); }
  // Writes the buffer into the caller's tensor when it is a staging copy.
  void copy_back() const;

 private:
  at::Tensor tensor_;
  at::Tensor buffer_;
  comm::DataType dtype_;
};

// The tensors of `list` flattened and concatenated into one contiguous buffer on `like`'s device
// and of its dtype (every tensor must match both). Throws naming `op` otherwise.
at::Tensor pack(const std::vector<at::Tensor>& list, const at::Tensor& like, const std::string& op);
// An uninitialized flat buffer with room for every tensor of `list`.
at::Tensor flat_like(const std::vector<at::Tensor>& list, const at::Tensor& like, const std::string& op);
// Copies consecutive slices of `flat` into the tensors of `list` (any layout).
void unpack(const at::Tensor& flat, const std::vector<at::Tensor>& list);
// numel() of each tensor.
std::vector<size_t> counts_of(const std::vector<at::Tensor>& list);

// Throws std::runtime_error "cohort distributed: <op>: <message>".
[[noreturn]] void fail(const std::string& op, const std::string& message);

comm::CallOptions call_options(const OpOptions& options);

// The Work of a call: with options.async_op returned pending; otherwise waited for (throwing on
// failure) and returned finished.
std::shared_ptr<Work> launch(std::string op, const OpOptions& options,
                             std::vector<std::shared_ptr<comm::Work>> transfers, Work::Finish finish = {});

// A Finish that copies every staged tensor back when the transfers succeeded.
Work::Finish copy_back_all(std::vector<StagedTensor> staged);

}  // namespace cohort::distributed::internal
