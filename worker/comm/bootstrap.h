#pragma once

// One call from an init URL to a ready communicator, as torch.distributed's init_process_group:
//
//   auto comm = cohort::comm::create_communicator("hierarchical", InitOptions::from_url("env://"));
//   if (!comm.ok()) { ...comm.status()... }
//
// Steps: resolve the init method (rank, world size, node, store), publish this rank's node id,
// connect the UCX transport through the store, build the communicator of `kind`.

#include <memory>
#include <string_view>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/communicator_factory.h"
#include "worker/comm/init/init_options.h"

namespace cohort::comm {

// The world of this process from an init method: UCX transport, store, every rank's node.
// Collective: every rank of the job calls it. Blocking up to init.timeout.
StatusOr<std::shared_ptr<CommWorld>> create_world(const InitOptions& init);

// The same from an already resolved bootstrap (a launcher that owns the store, cohort://).
StatusOr<std::shared_ptr<CommWorld>> create_world(const Bootstrap& boot, Duration timeout);

// create_world + create_communicator(kind, world).
StatusOr<std::unique_ptr<Communicator>> create_communicator(std::string_view kind, const InitOptions& init,
                                                            CommunicatorOptions options = {});

// ChainerMN's create_communicator() with no arguments: a communicator of kDefaultCommunicatorKind
// (hierarchical) over env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...; see init_options.h).
StatusOr<std::unique_ptr<Communicator>> create_communicator();
// A communicator of kDefaultCommunicatorKind over `init`.
StatusOr<std::unique_ptr<Communicator>> create_communicator(const InitOptions& init,
                                                            CommunicatorOptions options = {});

}  // namespace cohort::comm
