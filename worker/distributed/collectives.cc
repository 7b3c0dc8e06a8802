#include "worker/distributed/collectives.h"

#include <numeric>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "worker/autograd/tensor_comm.h"
#include "worker/distributed/tensor_staging.h"

namespace cohort::distributed {

using internal::call_options;
using internal::copy_back_all;
using internal::counts_of;
using internal::fail;
using internal::launch;
using internal::StagedTensor;

namespace {

void check_list_size(const Communicator& group, const std::vector<at::Tensor>& list, const std::string& op,
                     const char* name) {
  if (static_cast<int>(list.size()) != group.size()) {
    fail(op, fmt::format("{} has {} tensors; it needs one per rank ({})", name, list.size(), group.size()));
  }
}

void check_numel(const at::Tensor& t, int64_t want, const std::string& op, const char* what) {
  if (t.numel() != want) fail(op, fmt::format("{} has {} elements; it needs {}", what, t.numel(), want));
}

// A Finish that unpacks `flat` into `list` after successful transfers.
Work::Finish unpack_into(at::Tensor flat, std::vector<at::Tensor> list) {
  return [flat = std::move(flat), list = std::move(list)](const Status& transfers) {
    if (transfers.ok()) internal::unpack(flat, list);
    return transfers;
  };
}

// Elements per rank of all_to_all_single's `t` split by rows (`splits` empty: equal parts).
std::vector<size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits, int size,
                                 const std::string& op, const char* name) {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row_numel = rows == 0 ? 0 : t.numel() / rows;
  std::vector<size_t> counts;
  if (splits.empty()) {
    if (rows % size != 0) {
      fail(op, fmt::format("{} is empty, so dim 0 ({}) must divide by the group size {}; pass split sizes",
                           name, rows, size));
    }
    counts.assign(size, static_cast<size_t>(rows / size * row_numel));
    return counts;
  }
  if (static_cast<int>(splits.size()) != size) {
    fail(op, fmt::format("{} has {} entries; it needs one per rank ({})", name, splits.size(), size));
  }
  int64_t sum = 0;
  for (int64_t s : splits) {
    if (s < 0) fail(op, fmt::format("{} holds the negative size {}", name, s));
    sum += s;
    counts.push_back(static_cast<size_t>(s * row_numel));
  }
  if (sum != rows) fail(op, fmt::format("{} sums to {} rows, but the tensor has {}", name, sum, rows));
  return counts;
}

}  // namespace

std::shared_ptr<Work> all_reduce(Communicator& group, const at::Tensor& tensor, ReduceOp op,
                                 const OpOptions& options) {
  const std::string name = "all_reduce";
  StagedTensor t(tensor, name);
  auto transfer = group.allreduce(t.data(), t.data(), t.count(), t.dtype(), op, call_options(options));
  return launch(name, options, {transfer}, copy_back_all({t}));
}

std::shared_ptr<Work> broadcast(Communicator& group, const at::Tensor& tensor, int src,
                                const OpOptions& options) {
  const std::string name = fmt::format("broadcast from rank {}", src);
  StagedTensor t(tensor, name);
  auto transfer = group.broadcast(t.data(), t.count(), t.dtype(), src, call_options(options));
  return launch(name, options, {transfer}, copy_back_all({t}));
}

std::shared_ptr<Work> reduce(Communicator& group, const at::Tensor& tensor, int dst, ReduceOp op,
                             const OpOptions& options) {
  const std::string name = fmt::format("reduce to rank {}", dst);
  StagedTensor t(tensor, name);
  if (group.rank() == dst) {
    auto transfer = group.reduce(t.data(), t.data(), t.count(), t.dtype(), op, dst, call_options(options));
    return launch(name, options, {transfer}, copy_back_all({t}));
  }
  // Off dst the result is not significant: a scratch receive buffer keeps the caller's tensor as
  // it was (algorithms may reduce in place through intermediate ranks).
  at::Tensor scratch = at::empty_like(t.buffer());
  auto transfer = group.reduce(t.data(), scratch.numel() == 0 ? nullptr : scratch.data_ptr(), t.count(),
                               t.dtype(), op, dst, call_options(options));
  return launch(name, options, {transfer}, [scratch, t](const Status& transfers) { return transfers; });
}

std::shared_ptr<Work> all_gather(Communicator& group, const std::vector<at::Tensor>& tensor_list,
                                 const at::Tensor& tensor, const OpOptions& options) {
  const std::string name = "all_gather";
  check_list_size(group, tensor_list, name, "tensor_list");
  StagedTensor t(tensor, name);
  check_numel(tensor_list[group.rank()], tensor.numel(), name, "this rank's entry of tensor_list");
  at::Tensor flat = internal::flat_like(tensor_list, tensor, name);
  auto transfer = group.allgatherv(t.data(), flat.numel() == 0 ? nullptr : flat.data_ptr(),
                                   counts_of(tensor_list), t.dtype(), call_options(options));
  return launch(name, options, {transfer},
                [t, finish = unpack_into(flat, tensor_list)](const Status& s) { return finish(s); });
}

std::shared_ptr<Work> all_gather_into_tensor(Communicator& group, const at::Tensor& output,
                                             const at::Tensor& input, const OpOptions& options) {
  const std::string name = "all_gather_into_tensor";
  check_numel(output, input.numel() * group.size(), name, "output");
  StagedTensor in(input, name), out(output, name);
  auto transfer = group.allgather(in.data(), out.data(), in.count(), in.dtype(), call_options(options));
  return launch(name, options, {transfer}, copy_back_all({in, out}));
}

std::shared_ptr<Work> gather(Communicator& group, const at::Tensor& tensor,
                             const std::vector<at::Tensor>& gather_list, int dst, const OpOptions& options) {
  const std::string name = fmt::format("gather to rank {}", dst);
  StagedTensor t(tensor, name);
  std::vector<size_t> counts(group.size(), 0);
  at::Tensor flat;
  if (group.rank() == dst) {
    check_list_size(group, gather_list, name, "gather_list");
    check_numel(gather_list[dst], tensor.numel(), name, "this rank's entry of gather_list");
    counts = counts_of(gather_list);
    flat = internal::flat_like(gather_list, tensor, name);
  } else {
    // Off dst only this rank's count matters (the communicator reads dst's counts there).
    if (dst >= 0 && dst < group.size()) counts[group.rank()] = t.count();
  }
  void* recv = flat.defined() && flat.numel() > 0 ? flat.data_ptr() : nullptr;
  auto transfer = group.gatherv(t.data(), recv, counts, t.dtype(), dst, call_options(options));
  std::vector<at::Tensor> outputs = group.rank() == dst ? gather_list : std::vector<at::Tensor>{};
  return launch(name, options, {transfer},
                [t, finish = unpack_into(flat, outputs)](const Status& s) { return finish(s); });
}

std::shared_ptr<Work> scatter(Communicator& group, const at::Tensor& tensor,
                              const std::vector<at::Tensor>& scatter_list, int src,
                              const OpOptions& options) {
  const std::string name = fmt::format("scatter from rank {}", src);
  StagedTensor t(tensor, name);
  std::vector<size_t> counts(group.size(), 0);
  at::Tensor flat;
  if (group.rank() == src) {
    check_list_size(group, scatter_list, name, "scatter_list");
    check_numel(scatter_list[src], tensor.numel(), name, "this rank's entry of scatter_list");
    counts = counts_of(scatter_list);
    flat = internal::pack(scatter_list, tensor, name);
  } else if (src >= 0 && src < group.size()) {
    counts[group.rank()] = t.count();
  }
  const void* send = flat.defined() && flat.numel() > 0 ? flat.data_ptr() : nullptr;
  auto transfer = group.scatterv(send, counts, t.data(), t.dtype(), src, call_options(options));
  return launch(name, options, {transfer},
                [flat, finish = copy_back_all({t})](const Status& s) { return finish(s); });
}

std::shared_ptr<Work> reduce_scatter(Communicator& group, const at::Tensor& output,
                                     const std::vector<at::Tensor>& input_list, ReduceOp op,
                                     const OpOptions& options) {
  const std::string name = "reduce_scatter";
  check_list_size(group, input_list, name, "input_list");
  check_numel(input_list[group.rank()], output.numel(), name, "this rank's entry of input_list");
  StagedTensor out(output, name);
  at::Tensor flat = internal::pack(input_list, output, name);
  auto transfer = group.reduce_scatterv(flat.numel() == 0 ? nullptr : flat.data_ptr(), out.data(),
                                        counts_of(input_list), out.dtype(), op, call_options(options));
  return launch(name, options, {transfer},
                [flat, finish = copy_back_all({out})](const Status& s) { return finish(s); });
}

std::shared_ptr<Work> reduce_scatter_tensor(Communicator& group, const at::Tensor& output,
                                            const at::Tensor& input, ReduceOp op, const OpOptions& options) {
  const std::string name = "reduce_scatter_tensor";
  check_numel(input, output.numel() * group.size(), name, "input");
  StagedTensor in(input, name), out(output, name);
  auto transfer =
      group.reduce_scatter(in.data(), out.data(), out.count(), out.dtype(), op, call_options(options));
  return launch(name, options, {transfer}, copy_back_all({in, out}));
}

std::shared_ptr<Work> all_to_all(Communicator& group, const std::vector<at::Tensor>& output_list,
                                 const std::vector<at::Tensor>& input_list, const OpOptions& options) {
  const std::string name = "all_to_all";
  check_list_size(group, output_list, name, "output_list");
  check_list_size(group, input_list, name, "input_list");
  at::Tensor send = internal::pack(input_list, input_list[0], name);
  at::Tensor recv = internal::flat_like(output_list, input_list[0], name);
  auto transfer = group.alltoallv(send.numel() == 0 ? nullptr : send.data_ptr(), counts_of(input_list),
                                  recv.numel() == 0 ? nullptr : recv.data_ptr(), counts_of(output_list),
                                  autograd::to_data_type(send.scalar_type()), call_options(options));
  return launch(name, options, {transfer},
                [send, finish = unpack_into(recv, output_list)](const Status& s) { return finish(s); });
}

std::shared_ptr<Work> all_to_all_single(Communicator& group, const at::Tensor& output,
                                        const at::Tensor& input,
                                        const std::vector<int64_t>& output_split_sizes,
                                        const std::vector<int64_t>& input_split_sizes,
                                        const OpOptions& options) {
  const std::string name = "all_to_all_single";
  std::vector<size_t> send_counts =
      split_counts(input, input_split_sizes, group.size(), name, "input_split_sizes");
  std::vector<size_t> recv_counts =
      split_counts(output, output_split_sizes, group.size(), name, "output_split_sizes");
  StagedTensor in(input, name), out(output, name);
  if (in.data() != nullptr && in.data() == out.data())
    fail(name, "input and output must be distinct tensors");
  auto transfer =
      group.alltoallv(in.data(), send_counts, out.data(), recv_counts, in.dtype(), call_options(options));
  return launch(name, options, {transfer}, copy_back_all({in, out}));
}

std::shared_ptr<Work> barrier(Communicator& group, const OpOptions& options) {
  return launch("barrier", options, {group.barrier(call_options(options))});
}

}  // namespace cohort::distributed
