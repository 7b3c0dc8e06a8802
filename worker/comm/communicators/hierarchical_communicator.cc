#include "worker/comm/communicators/hierarchical_communicator.h"

#include <algorithm>
#include <map>

#include "worker/comm/communicators/node_nccl.h"
#include "worker/comm/reduce/reduce_kernels.h"
#include "worker/comm/transport/nccl/device_memory.h"
#if COHORT_CUDA
#include "worker/comm/transport/nccl/nccl_transport.h"
#endif

namespace cohort::comm {
namespace {

CallOptions within(Deadline deadline) { return CallOptions{deadline.remaining(), true}; }

#if COHORT_CUDA
// The inter-node step of the two-level kinds' NCCL allreduce: `count` elements of device memory at
// `buf` allreduced over `group` (UCX) through pinned host memory, and for AVG divided there by
// `ranks`, the whole communicator's size.
Status allreduce_through_host(Communicator& group, std::unique_ptr<PinnedBuffer>& staging, void* buf,
                              size_t count, DataType dtype, ReduceOp op, int ranks, Deadline deadline,
                              const char* what) {
  size_t bytes = count * element_size(dtype);
  if (staging == nullptr) staging = std::make_unique<PinnedBuffer>();
  COHORT_ASSIGN_OR_RETURN(void* host, staging->reserve(bytes));
  COHORT_RETURN_IF_ERROR(copy_to_host(host, buf, bytes));
  ReduceOp base = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  COHORT_RETURN_IF_ERROR(
      group.allreduce(host, host, count, dtype, base, within(deadline))->wait().with_context(what));
  if (op == ReduceOp::kAvg) scale_for_average(host, count, dtype, ranks);
  return copy_to_device(buf, host, bytes);
}
#endif

// The node's NCCL communicator of a two-level kind, decided once (at the first device call) from
// the GPUs of `intra`'s ranks: null when they do not each have their own (then staging).
StatusOr<NcclTransport*> lazy_node_nccl(bool& decided, std::shared_ptr<NcclTransport>& nccl,
                                        Communicator& intra, Store& store, int device,
                                        const std::string& key_prefix, const std::string& who,
                                        Deadline deadline) {
  if (decided) return nccl.get();
  decided = true;
  if (!cuda_build()) return nullptr;
  // Every rank of the node reaches the same decision from the same records.
  COHORT_ASSIGN_OR_RETURN(std::vector<std::string> ids, intra.allgather_obj(device_id_record(device)));
  COHORT_ASSIGN_OR_RETURN(nccl, make_node_nccl(ids, store, intra.rank(), device, key_prefix, who, deadline));
  return nccl.get();
}

}  // namespace

HierarchicalCommunicator::HierarchicalCommunicator(std::shared_ptr<CommWorld> world,
                                                   std::vector<int> global_ranks, int rank,
                                                   uint64_t context_id, CommunicatorOptions options)
    : Communicator("hierarchical", std::move(world), std::move(global_ranks), rank, context_id, options) {}

HierarchicalCommunicator::~HierarchicalCommunicator() { stop_executor(); }

StatusOr<NcclTransport*> HierarchicalCommunicator::intra_nccl(Deadline deadline) {
  return lazy_node_nccl(intra_nccl_decided_, intra_nccl_, *intra_, *world()->store, cuda_device(),
                        fmt::format("cohort/nccl/{}/node{}", context_id(), inter_rank()), description(),
                        deadline);
}

Status HierarchicalCommunicator::device_collective(const DeviceCall& call, Deadline deadline,
                                                   const HostBody& host_path) {
  if (call.collective != Collective::kAllreduce)
    return Communicator::device_collective(call, deadline, host_path);
  COHORT_ASSIGN_OR_RETURN(NcclTransport * nccl, intra_nccl(deadline));
  if (nccl == nullptr) return Communicator::device_collective(call, deadline, host_path);
  // The node's other ranks run this allreduce on NCCL: no falling back to staging here.
  COHORT_RETURN_IF_ERROR(call.check_all_device(description()));
#if COHORT_CUDA
  const void* send = call.send;
  void* recv = call.recv;
  const size_t count = call.count;
  const DataType dtype = call.dtype;
  const ReduceOp op = call.op;
  ReduceOp base = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  COHORT_RETURN_IF_ERROR(nccl->reduce(send != nullptr ? send : recv, recv, count, dtype, base, 0, deadline)
                             .with_context("intra-node NCCL reduce"));
  if (leaders_ != nullptr) {
    // Only the leaders cross nodes; they also average, so the broadcast carries the final values.
    COHORT_RETURN_IF_ERROR(allreduce_through_host(*leaders_, leader_staging_, recv, count, dtype, op, size(),
                                                  deadline, "inter-node allreduce among node leaders"));
  }
  return nccl->broadcast(recv, count, dtype, 0, deadline).with_context("intra-node NCCL broadcast");
#else
  return internal_error("unreachable: intra-node NCCL in a CPU-only build");
#endif
}

StatusOr<std::unique_ptr<Communicator>> HierarchicalCommunicator::create(std::shared_ptr<CommWorld> world,
                                                                         std::vector<int> global_ranks,
                                                                         int rank, uint64_t context_id,
                                                                         CommunicatorOptions options) {
  auto comm = std::make_unique<HierarchicalCommunicator>(std::move(world), std::move(global_ranks), rank,
                                                         context_id, options);
  COHORT_ASSIGN_OR_RETURN(comm->intra_, comm->split_as(comm->inter_rank(), comm->rank(), "flat"));
  COHORT_ASSIGN_OR_RETURN(
      comm->leaders_, comm->split_as(comm->intra_rank() == 0 ? 0 : kUndefinedColor, comm->rank(), "flat"));
  return std::unique_ptr<Communicator>(std::move(comm));
}

Status HierarchicalCommunicator::allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op,
                                                    Deadline deadline) {
  COHORT_RETURN_IF_ERROR(intra_->reduce(buf, buf, count, dtype, op, 0, within(deadline))
                             ->wait()
                             .with_context("intra-node reduce"));
  if (leaders_ != nullptr) {
    COHORT_RETURN_IF_ERROR(leaders_->allreduce(buf, buf, count, dtype, op, within(deadline))
                               ->wait()
                               .with_context("inter-node allreduce among node leaders"));
  }
  return intra_->broadcast(buf, count, dtype, 0, within(deadline))
      ->wait()
      .with_context("intra-node broadcast");
}

StatusOr<std::unique_ptr<Communicator>> TwoDimensionalCommunicator::create(std::shared_ptr<CommWorld> world,
                                                                           std::vector<int> global_ranks,
                                                                           int rank, uint64_t context_id,
                                                                           CommunicatorOptions options) {
  // Every node must hold the same number of ranks, or the per-shard groups would miss nodes.
  std::map<std::string, int> per_node;
  for (int global : global_ranks) ++per_node[world->node_ids[global]];
  int expected = per_node.begin()->second;
  for (const auto& [node, count] : per_node) {
    if (count != expected) {
      return failed_precondition_error(
          "two_dimensional communicator needs the same number of ranks on every node, but node '{}' has {} "
          "and node "
          "'{}' has {}; use hierarchical instead",
          per_node.begin()->first, expected, node, count);
    }
  }
  auto comm = std::make_unique<TwoDimensionalCommunicator>(std::move(world), std::move(global_ranks), rank,
                                                           context_id, options);
  COHORT_ASSIGN_OR_RETURN(comm->intra_, comm->split_as(comm->inter_rank(), comm->rank(), "flat"));
  COHORT_ASSIGN_OR_RETURN(comm->inter_, comm->split_as(comm->intra_rank(), comm->rank(), "flat"));
  return std::unique_ptr<Communicator>(std::move(comm));
}

Status TwoDimensionalCommunicator::allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op,
                                                      Deadline deadline) {
  // Shards as even as possible: the first count % n ranks hold one extra element.
  int n = intra_->size();
  std::vector<size_t> counts(n, count / n);
  for (size_t r = 0; r < count % n; ++r) ++counts[r];
  size_t esize = element_size(dtype);
  size_t offset = 0;
  for (int r = 0; r < intra_->rank(); ++r) offset += counts[r];
  uint8_t* shard = staging(counts[intra_->rank()] * esize);
  COHORT_RETURN_IF_ERROR(intra_->reduce_scatterv(buf, shard, counts, dtype, op, within(deadline))
                             ->wait()
                             .with_context("intra-node reduce-scatter"));
  COHORT_RETURN_IF_ERROR(inter_->allreduce(shard, shard, counts[intra_->rank()], dtype, op, within(deadline))
                             ->wait()
                             .with_context("inter-node allreduce of this shard"));
  return intra_->allgatherv(shard, buf, counts, dtype, within(deadline))
      ->wait()
      .with_context("intra-node allgather");
}

TwoDimensionalCommunicator::TwoDimensionalCommunicator(std::shared_ptr<CommWorld> world,
                                                       std::vector<int> global_ranks, int rank,
                                                       uint64_t context_id, CommunicatorOptions options)
    : Communicator("two_dimensional", std::move(world), std::move(global_ranks), rank, context_id, options) {}

TwoDimensionalCommunicator::~TwoDimensionalCommunicator() { stop_executor(); }

Status TwoDimensionalCommunicator::device_collective(const DeviceCall& call, Deadline deadline,
                                                     const HostBody& host_path) {
  if (call.collective != Collective::kAllreduce)
    return Communicator::device_collective(call, deadline, host_path);
  NcclTransport* nccl = nullptr;
  // NCCL's reduce-scatter takes equal shards: other counts are staged whole.
  if (call.count % static_cast<size_t>(intra_->size()) == 0) {
    COHORT_ASSIGN_OR_RETURN(
        nccl, lazy_node_nccl(intra_nccl_decided_, intra_nccl_, *intra_, *world()->store, cuda_device(),
                             fmt::format("cohort/nccl/{}/node{}", context_id(), inter_rank()), description(),
                             deadline));
  }
  if (nccl == nullptr) return Communicator::device_collective(call, deadline, host_path);
  // The node's other ranks run this allreduce on NCCL: no falling back to staging here.
  COHORT_RETURN_IF_ERROR(call.check_all_device(description()));
#if COHORT_CUDA
  const void* send = call.send;
  void* recv = call.recv;
  const size_t count = call.count;
  const DataType dtype = call.dtype;
  const ReduceOp op = call.op;
  ReduceOp base = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  const size_t shard = count / static_cast<size_t>(intra_->size());
  const size_t shard_bytes = shard * element_size(dtype);
  uint8_t* mine = static_cast<uint8_t*>(recv) + shard_bytes * static_cast<size_t>(intra_->rank());
  // Out of place, reduce-scatter straight from `send` into this rank's shard of `recv`.
  COHORT_RETURN_IF_ERROR(
      nccl->reduce_scatter(call.in_place() ? recv : send, mine, shard, dtype, base, deadline)
          .with_context("intra-node NCCL reduce-scatter"));
  // This shard across nodes; averaged here so the allgather carries final values.
  COHORT_RETURN_IF_ERROR(allreduce_through_host(*inter_, shard_staging_, mine, shard, dtype, op, size(),
                                                deadline, "inter-node allreduce of this shard"));
  return nccl->allgather(nullptr, recv, shard, dtype, deadline).with_context("intra-node NCCL allgather");
#else
  return internal_error("unreachable: intra-node NCCL in a CPU-only build");
#endif
}

}  // namespace cohort::comm
