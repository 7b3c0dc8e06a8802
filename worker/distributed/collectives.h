#pragma once

// torch.distributed's collectives on at::Tensor, in place, over a cohort Communicator (the
// `group`: any communicator, e.g. one from Communicator::new_group or split). Include
// worker/distributed/process_group.h for the whole API and the torch.distributed → cohort table.
//
// Every call: CPU or CUDA tensors of Half, BFloat16, Float, Double, Char, Byte, Int, Long; a
// non-contiguous tensor is copied into a contiguous buffer for the transfer and its result copied
// back when the call finishes (Work::wait / is_completed for async_op) — one extra copy each way.
// Blocking by default (throws std::runtime_error naming the call and the communicator's error);
// with options.async_op the Work is returned pending and the tensors must not be touched until it
// completed. Every rank of `group` must issue the same collectives in the same order.

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include "worker/comm/communicator.h"
#include "worker/distributed/op_options.h"
#include "worker/distributed/work.h"

namespace cohort::distributed {

using comm::Communicator;
using comm::ReduceOp;

// tensor ← op over every rank's tensor.
std::shared_ptr<Work> all_reduce(Communicator& group, const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum,
                                 const OpOptions& options = {});
// tensor ← src's tensor (same numel and dtype on every rank).
std::shared_ptr<Work> broadcast(Communicator& group, const at::Tensor& tensor, int src,
                                const OpOptions& options = {});
// dst's tensor ← op over every rank's tensor; the others' tensors are left unchanged.
std::shared_ptr<Work> reduce(Communicator& group, const at::Tensor& tensor, int dst,
                             ReduceOp op = ReduceOp::kSum, const OpOptions& options = {});

// tensor_list[r] ← rank r's tensor. Shapes may differ per rank: tensor_list[r] must have rank r's
// numel (and tensor_list[rank] this rank's), the same on every rank.
std::shared_ptr<Work> all_gather(Communicator& group, const std::vector<at::Tensor>& tensor_list,
                                 const at::Tensor& tensor, const OpOptions& options = {});
// output (size() × input.numel() elements, e.g. [size * n, ...] or [size, n, ...]) ← every rank's
// input in rank order.
std::shared_ptr<Work> all_gather_into_tensor(Communicator& group, const at::Tensor& output,
                                             const at::Tensor& input, const OpOptions& options = {});

// At dst: gather_list[r] ← rank r's tensor (numels may differ per rank). Elsewhere gather_list is
// ignored (pass {}).
std::shared_ptr<Work> gather(Communicator& group, const at::Tensor& tensor,
                             const std::vector<at::Tensor>& gather_list, int dst,
                             const OpOptions& options = {});
// tensor ← scatter_list[rank] of src (numels may differ per rank: each rank's tensor has the numel
// of its entry). Off src scatter_list is ignored (pass {}).
std::shared_ptr<Work> scatter(Communicator& group, const at::Tensor& tensor,
                              const std::vector<at::Tensor>& scatter_list, int src,
                              const OpOptions& options = {});

// output ← op over every rank's input_list[rank] (input_list[r] has rank r's output numel).
std::shared_ptr<Work> reduce_scatter(Communicator& group, const at::Tensor& output,
                                     const std::vector<at::Tensor>& input_list, ReduceOp op = ReduceOp::kSum,
                                     const OpOptions& options = {});
// output ← op over every rank's block `rank` of input (size() × output.numel() elements).
std::shared_ptr<Work> reduce_scatter_tensor(Communicator& group, const at::Tensor& output,
                                            const at::Tensor& input, ReduceOp op = ReduceOp::kSum,
                                            const OpOptions& options = {});

// output_list[r] ← rank r's input_list[rank]; input_list[r] goes to rank r. Numels may differ.
std::shared_ptr<Work> all_to_all(Communicator& group, const std::vector<at::Tensor>& output_list,
                                 const std::vector<at::Tensor>& input_list, const OpOptions& options = {});
// input is split along dim 0 by input_split_sizes (empty: size() equal parts), part r going to
// rank r; output is filled along dim 0 with rank r's part in output_split_sizes[r] rows (empty:
// equal parts). Rows of both have the same shape.
std::shared_ptr<Work> all_to_all_single(Communicator& group, const at::Tensor& output,
                                        const at::Tensor& input,
                                        const std::vector<int64_t>& output_split_sizes = {},
                                        const std::vector<int64_t>& input_split_sizes = {},
                                        const OpOptions& options = {});

// Returns once every rank of group entered it.
std::shared_ptr<Work> barrier(Communicator& group, const OpOptions& options = {});

// A barrier that names who is missing (torch.distributed.monitored_barrier, blocking, for
// debugging): rank 0 waits up to `timeout` for every other rank's arrival, then releases them.
// When some rank did not arrive, rank 0 throws naming it (wait_all_ranks: every such rank, else
// the first), and the ranks that arrived throw saying rank 0 found missing ranks. Ranks other than
// 0 wait up to 2 × timeout for the release (rank 0 may itself arrive late). Uses point-to-point
// tags reserved by the API (see point_to_point.h), not the collective queue.
void monitored_barrier(Communicator& group, std::optional<comm::Duration> timeout = std::nullopt,
                       bool wait_all_ranks = false);

}  // namespace cohort::distributed
