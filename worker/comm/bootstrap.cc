#include "worker/comm/bootstrap.h"

#include "worker/comm/transport/ucx/ucx_transport.h"

namespace cohort::comm {
namespace {

// Store key under which each rank publishes the node it runs on.
std::string node_key(int rank) { return "cohort/node_id/" + std::to_string(rank); }

}  // namespace

StatusOr<std::shared_ptr<CommWorld>> create_world(const InitOptions& init) {
  COHORT_ASSIGN_OR_RETURN(Bootstrap boot, resolve_init(init));
  return create_world(boot, init.timeout);
}

StatusOr<std::shared_ptr<CommWorld>> create_world(const Bootstrap& boot, Duration timeout) {
  COHORT_RETURN_IF_ERROR(boot.store->set(node_key(boot.rank), boot.node_id));
  auto world = std::make_shared<CommWorld>();
  world->store = boot.store;
  for (int r = 0; r < boot.world_size; ++r) {
    auto node = boot.store->get(node_key(r), timeout);
    if (!node.ok()) {
      return node.status().with_context(fmt::format("rank {} waiting for rank {} to join ({} ranks expected)",
                                                    boot.rank, r, boot.world_size));
    }
    world->node_ids.push_back(*node);
  }
  UcxOptions ucx;
  ucx.connect_timeout = timeout;
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> transport,
                          UcxTransport::create(*boot.store, boot.rank, boot.world_size, ucx));
  world->transport = std::move(transport);
  return world;
}

StatusOr<std::unique_ptr<Communicator>> create_communicator(std::string_view kind, const InitOptions& init,
                                                            CommunicatorOptions options) {
  COHORT_ASSIGN_OR_RETURN(std::shared_ptr<CommWorld> world, create_world(init));
  return create_communicator(kind, std::move(world), options);
}

StatusOr<std::unique_ptr<Communicator>> create_communicator() {
  return create_communicator(kDefaultCommunicatorKind, InitOptions::from_url("env://"));
}

StatusOr<std::unique_ptr<Communicator>> create_communicator(const InitOptions& init, CommunicatorOptions options) {
  return create_communicator(kDefaultCommunicatorKind, init, options);
}

}  // namespace cohort::comm
