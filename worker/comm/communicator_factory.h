#pragma once

// Communicators by ChainerMN's names. All kinds give the same results; they differ in how they
// move data:
//   naive            simplest algorithms (linear reduce + broadcast): a reference point
//   flat             algorithms picked by size and rank count over all ranks
//   hierarchical     intra-node reduce → inter-node allreduce among node leaders → intra bcast
//   two_dimensional  intra-node reduce-scatter → inter-node allreduce per shard → intra allgather
//   single_node      flat, and refuses to run when ranks span nodes
//   pure_nccl        NCCL over all ranks (needs a --config=cuda build)

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"

namespace cohort::comm {

// The kind names, in the order above.
const std::vector<std::string>& communicator_kinds();

// The kind a communicator gets when none is named: ChainerMN's create_communicator() default.
inline constexpr std::string_view kDefaultCommunicatorKind = "hierarchical";

// The world communicator of `kind` over a ready CommWorld (every rank of the transport).
// Collective: every rank calls it. Blocking.
StatusOr<std::unique_ptr<Communicator>> create_communicator(std::string_view kind, std::shared_ptr<CommWorld> world,
                                                            CommunicatorOptions options = {});
// The same with no kind named: kDefaultCommunicatorKind (hierarchical), as ChainerMN's.
StatusOr<std::unique_ptr<Communicator>> create_communicator(std::shared_ptr<CommWorld> world,
                                                            CommunicatorOptions options = {});

// A communicator of `kind` over `global_ranks` with an agreed context id (used by split).
// Collective over those ranks: kinds with sub-communicators split them here.
StatusOr<std::unique_ptr<Communicator>> make_communicator(std::string_view kind, std::shared_ptr<CommWorld> world,
                                                          std::vector<int> global_ranks, int rank,
                                                          uint64_t context_id, CommunicatorOptions options);

}  // namespace cohort::comm
