#pragma once

// torch.distributed's object collectives and ChainerMN's send_obj / recv_obj, for any value
// torch::pickle_save handles (c10::IValue: numbers, strings, tensors, lists, dicts, tuples, ...).
// Each object is pickled (torch::jit::pickle_save, the format torch.save / torch.load read) on its
// sender and unpickled on its receiver. Blocking, as in torch.distributed (whose object calls take
// no async_op): options.timeout bounds the whole call (default: the communicator's timeout), and
// options.async_op is refused with an error naming the call (use the tensor calls for async_op).
// Failures throw std::runtime_error naming the call. Tensors inside objects travel as pickled CPU data: move
// CUDA tensors to the CPU first (the pickler stores a tensor's device but not its data
// otherwise).
//
//   std::vector<c10::IValue> objects;
//   if (rank == 0) objects = {c10::IValue("foo"), c10::IValue(12), c10::IValue(c10::Dict<...>)};
//   broadcast_object_list(*comm, objects, /*src=*/0);   // every rank now holds rank 0's three

#include <vector>

#include <ATen/core/ivalue.h>

#include "worker/comm/communicator.h"
#include "worker/distributed/op_options.h"

namespace cohort::distributed {

using comm::Communicator;

// object_list ← src's object_list (resized to its length off src).
void broadcast_object_list(Communicator& group, std::vector<c10::IValue>& object_list, int src,
                           const OpOptions& options = {});
// object_list ← every rank's obj, in rank order (resized to size()).
void all_gather_object(Communicator& group, std::vector<c10::IValue>& object_list, const c10::IValue& obj,
                       const OpOptions& options = {});
// At dst: object_gather_list ← every rank's obj, in rank order; elsewhere it is left untouched
// (may be null).
void gather_object(Communicator& group, const c10::IValue& obj, std::vector<c10::IValue>* object_gather_list,
                   int dst, const OpOptions& options = {});
// output_list ← {src's input_list[rank]} (torch's scatter_object_output_list: one element).
// input_list is read at src only and must have one object per rank.
void scatter_object_list(Communicator& group, std::vector<c10::IValue>& output_list,
                         const std::vector<c10::IValue>& input_list, int src, const OpOptions& options = {});

// ChainerMN's send_obj / recv_obj: one object to / from a peer (point to point, tag < kMaxTag).
void send_obj(Communicator& group, const c10::IValue& obj, int dest, uint32_t tag = 0,
              const OpOptions& options = {});
c10::IValue recv_obj(Communicator& group, int source, uint32_t tag = 0, const OpOptions& options = {});

}  // namespace cohort::distributed
