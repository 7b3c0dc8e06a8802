#include "worker/comm/communicators/hierarchical_communicator.h"

#include <algorithm>
#include <map>

namespace cohort::comm {
namespace {

CallOptions within(Deadline deadline) { return CallOptions{deadline.remaining(), true}; }

}  // namespace

StatusOr<std::unique_ptr<Communicator>> HierarchicalCommunicator::create(std::shared_ptr<CommWorld> world,
                                                                         std::vector<int> global_ranks, int rank,
                                                                         uint64_t context_id,
                                                                         CommunicatorOptions options) {
  auto comm = std::make_unique<HierarchicalCommunicator>(std::move(world), std::move(global_ranks), rank, context_id,
                                                         options);
  COHORT_ASSIGN_OR_RETURN(comm->intra_, comm->split_as(comm->inter_rank(), comm->rank(), "flat"));
  COHORT_ASSIGN_OR_RETURN(comm->leaders_,
                          comm->split_as(comm->intra_rank() == 0 ? 0 : kUndefinedColor, comm->rank(), "flat"));
  return std::unique_ptr<Communicator>(std::move(comm));
}

Status HierarchicalCommunicator::allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op,
                                                    Deadline deadline) {
  COHORT_RETURN_IF_ERROR(
      intra_->reduce(buf, buf, count, dtype, op, 0, within(deadline))->wait().with_context("intra-node reduce"));
  if (leaders_ != nullptr) {
    COHORT_RETURN_IF_ERROR(leaders_->allreduce(buf, buf, count, dtype, op, within(deadline))
                               ->wait()
                               .with_context("inter-node allreduce among node leaders"));
  }
  return intra_->broadcast(buf, count, dtype, 0, within(deadline))->wait().with_context("intra-node broadcast");
}

StatusOr<std::unique_ptr<Communicator>> TwoDimensionalCommunicator::create(std::shared_ptr<CommWorld> world,
                                                                           std::vector<int> global_ranks, int rank,
                                                                           uint64_t context_id,
                                                                           CommunicatorOptions options) {
  // Every node must hold the same number of ranks, or the per-shard groups would miss nodes.
  std::map<std::string, int> per_node;
  for (int global : global_ranks) ++per_node[world->node_ids[global]];
  int expected = per_node.begin()->second;
  for (const auto& [node, count] : per_node) {
    if (count != expected) {
      return failed_precondition_error(
          "two_dimensional communicator needs the same number of ranks on every node, but node '{}' has {} and node "
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
  return intra_->allgatherv(shard, buf, counts, dtype, within(deadline))->wait().with_context("intra-node allgather");
}

}  // namespace cohort::comm
