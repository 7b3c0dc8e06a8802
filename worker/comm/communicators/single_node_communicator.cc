#include "worker/comm/communicators/single_node_communicator.h"

#include <map>

#include "worker/comm/algorithms/collectives.h"
#include "worker/comm/communicators/node_nccl.h"
#include "worker/comm/transport/nccl/device_memory.h"
#if COHORT_CUDA
#include "worker/comm/communicators/pure_nccl_communicator.h"
#include "worker/comm/transport/nccl/nccl_transport.h"
#endif

namespace cohort::comm {

StatusOr<std::unique_ptr<Communicator>> SingleNodeCommunicator::create(std::shared_ptr<CommWorld> world,
                                                                       std::vector<int> global_ranks,
                                                                       int rank, uint64_t context_id,
                                                                       CommunicatorOptions options) {
  std::map<std::string, std::string> ranks_by_node;
  for (size_t r = 0; r < global_ranks.size(); ++r) {
    std::string& list = ranks_by_node[world->node_ids[global_ranks[r]]];
    list += (list.empty() ? "" : ",") + std::to_string(r);
  }
  if (ranks_by_node.size() > 1) {
    std::string nodes;
    for (const auto& [node, ranks] : ranks_by_node) {
      nodes += fmt::format("{}node '{}': ranks {}", nodes.empty() ? "" : "; ", node, ranks);
    }
    return failed_precondition_error(
        "single_node communicator needs every rank on one node, but the ranks span {} nodes ({}); use "
        "hierarchical, "
        "two_dimensional or flat",
        ranks_by_node.size(), nodes);
  }
  return std::unique_ptr<Communicator>(std::make_unique<SingleNodeCommunicator>(
      std::move(world), std::move(global_ranks), rank, context_id, options));
}

SingleNodeCommunicator::SingleNodeCommunicator(std::shared_ptr<CommWorld> world,
                                               std::vector<int> global_ranks, int rank, uint64_t context_id,
                                               CommunicatorOptions options)
    : Communicator("single_node", std::move(world), std::move(global_ranks), rank, context_id, options) {}

SingleNodeCommunicator::~SingleNodeCommunicator() { stop_executor(); }

StatusOr<NcclTransport*> SingleNodeCommunicator::node_nccl(Deadline deadline) {
  if (node_nccl_decided_) return node_nccl_.get();
  node_nccl_decided_ = true;
  if (!cuda_build()) return nullptr;
  // Runs on this communicator's executor, so the records travel by a direct collective rather
  // than allgather_obj (which would queue behind the running operation).
  std::string mine = device_id_record(cuda_device());
  std::vector<char> all(kDeviceIdBytes * size());
  COHORT_RETURN_IF_ERROR(run_collective("device ids", deadline, [&](CollectiveContext& ctx) {
    return run_allgatherv(ctx, mine.data(), all.data(), std::vector<size_t>(size(), kDeviceIdBytes));
  }));
  std::vector<std::string> ids;
  for (int r = 0; r < size(); ++r) ids.emplace_back(all.data() + r * kDeviceIdBytes, kDeviceIdBytes);
  COHORT_ASSIGN_OR_RETURN(node_nccl_, make_node_nccl(ids, *world()->store, this->rank(), cuda_device(),
                                                     fmt::format("cohort/nccl/{}/single_node", context_id()),
                                                     description(), deadline));
  return node_nccl_.get();
}

Status SingleNodeCommunicator::device_collective(const DeviceCall& call, Deadline deadline,
                                                 const HostBody& host) {
  COHORT_ASSIGN_OR_RETURN(NcclTransport * nccl, node_nccl(deadline));
#if COHORT_CUDA
  if (nccl != nullptr) return run_on_nccl(*nccl, call, description(), deadline);
#else
  (void)nccl;
#endif
  return Communicator::device_collective(call, deadline, host);
}

}  // namespace cohort::comm
