#include "worker/comm/communicators/single_node_communicator.h"

#include <map>

namespace cohort::comm {

StatusOr<std::unique_ptr<Communicator>> SingleNodeCommunicator::create(std::shared_ptr<CommWorld> world,
                                                                       std::vector<int> global_ranks, int rank,
                                                                       uint64_t context_id,
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
        "single_node communicator needs every rank on one node, but the ranks span {} nodes ({}); use hierarchical, "
        "two_dimensional or flat",
        ranks_by_node.size(), nodes);
  }
  return std::make_unique<Communicator>("single_node", std::move(world), std::move(global_ranks), rank, context_id,
                                        options);
}

}  // namespace cohort::comm
