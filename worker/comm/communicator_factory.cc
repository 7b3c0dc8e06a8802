#include "worker/comm/communicator_factory.h"

#include <numeric>

#include "worker/comm/communicators/hierarchical_communicator.h"
#include "worker/comm/communicators/naive_communicator.h"
#include "worker/comm/communicators/pure_nccl_communicator.h"
#include "worker/comm/communicators/single_node_communicator.h"
#include "worker/comm/communicators/two_dimensional_communicator.h"

namespace cohort::comm {

const std::vector<std::string>& communicator_kinds() {
  static const std::vector<std::string> kinds = {"naive", "flat", "hierarchical", "two_dimensional",
                                                 "single_node", "pure_nccl"};
  return kinds;
}

StatusOr<std::unique_ptr<Communicator>> make_communicator(std::string_view kind, std::shared_ptr<CommWorld> world,
                                                          std::vector<int> global_ranks, int rank,
                                                          uint64_t context_id, CommunicatorOptions options) {
  if (kind == "flat") {
    return std::make_unique<Communicator>("flat", std::move(world), std::move(global_ranks), rank, context_id, options);
  }
  if (kind == "naive") {
    return std::unique_ptr<Communicator>(
        std::make_unique<NaiveCommunicator>(std::move(world), std::move(global_ranks), rank, context_id, options));
  }
  if (kind == "hierarchical") {
    return HierarchicalCommunicator::create(std::move(world), std::move(global_ranks), rank, context_id, options);
  }
  if (kind == "two_dimensional") {
    return TwoDimensionalCommunicator::create(std::move(world), std::move(global_ranks), rank, context_id, options);
  }
  if (kind == "single_node") {
    return SingleNodeCommunicator::create(std::move(world), std::move(global_ranks), rank, context_id, options);
  }
  if (kind == "pure_nccl") {
    return create_pure_nccl_communicator(std::move(world), std::move(global_ranks), rank, context_id, options);
  }
  std::string names;
  for (const std::string& name : communicator_kinds()) names += (names.empty() ? "" : ", ") + name;
  return invalid_argument_error("unknown communicator kind '{}' (expected one of: {})", kind, names);
}

StatusOr<std::unique_ptr<Communicator>> create_communicator(std::string_view kind, std::shared_ptr<CommWorld> world,
                                                            CommunicatorOptions options) {
  if (world == nullptr || world->transport == nullptr || world->store == nullptr) {
    return invalid_argument_error("create_communicator: the CommWorld needs a transport and a store");
  }
  int size = world->transport->size();
  if (static_cast<int>(world->node_ids.size()) != size) {
    return invalid_argument_error("create_communicator: {} node ids for {} ranks", world->node_ids.size(), size);
  }
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  int rank = world->transport->rank();
  return make_communicator(kind, std::move(world), std::move(ranks), rank, 0, options);
}

StatusOr<std::unique_ptr<Communicator>> create_communicator(std::shared_ptr<CommWorld> world,
                                                            CommunicatorOptions options) {
  return create_communicator(kDefaultCommunicatorKind, std::move(world), options);
}

}  // namespace cohort::comm
