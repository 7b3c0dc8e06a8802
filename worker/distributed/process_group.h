#pragma once

// cohort's torch.distributed: the tensor-level process-group API over a cohort Communicator.
// One include gives every call; a torch.distributed program translates line by line (the table
// is in worker/README.md, "torch.distributed → cohort"):
//
//   #include "worker/distributed/process_group.h"
//   namespace dist = cohort::distributed;
//
//   auto world = cohort::comm::create_communicator("flat", InitOptions::from_url("env://")).value();
//   auto group = world->new_group({0, 1}).value();          // dist.new_group([0, 1]); null off the group
//   at::Tensor t = at::ones({1});
//   if (group) dist::all_reduce(*group, t, dist::ReduceOp::kSum);          // blocking, in place
//   auto work = dist::all_reduce(*world, t, dist::ReduceOp::kSum, {.async_op = true, .timeout = 30s});
//   work->wait();                                           // throws if the call failed
//
// Conventions (every call):
//  - The group comes first (torch's `group=` keyword): any Communicator, the world or one made by
//    new_group / split. Ranks are the group's ranks.
//  - Tensors are modified in place. CPU and CUDA tensors; a non-contiguous tensor is copied into a
//    contiguous buffer for the transfer and the result copied back into it when the call finishes
//    (on return, or in Work::wait / is_completed with async_op): one extra copy each way.
//  - options.async_op returns a pending Work (work.h: wait(timeout), is_completed(), exception());
//    otherwise the call blocks and throws std::runtime_error naming the call, the communicator and
//    the cause. options.timeout bounds this call (default: the communicator's timeout): a dead or
//    silent peer is an error after it, never a hang.
//  - Ops: ReduceOp::kSum, kProduct, kMin, kMax, kAvg (torch's SUM, PRODUCT, MIN, MAX, AVG).

#include "worker/comm/communicator.h"
#include "worker/distributed/collectives.h"
#include "worker/distributed/object_collectives.h"
#include "worker/distributed/op_options.h"
#include "worker/distributed/point_to_point.h"
#include "worker/distributed/work.h"

namespace cohort::distributed {

// torch.distributed.get_rank / get_world_size of a group.
inline int get_rank(const Communicator& group) { return group.rank(); }
inline int get_world_size(const Communicator& group) { return group.size(); }

}  // namespace cohort::distributed
