#include "worker/comm/communicators/pure_nccl_communicator.h"

namespace cohort::comm {

StatusOr<std::unique_ptr<Communicator>> create_pure_nccl_communicator(std::shared_ptr<CommWorld> /*world*/,
                                                                      std::vector<int> /*global_ranks*/, int /*rank*/,
                                                                      uint64_t /*context_id*/,
                                                                      CommunicatorOptions /*options*/) {
  return failed_precondition_error(
      "the pure_nccl communicator needs NCCL, and this is a CPU-only build: rebuild with `bazel build --config=cuda` "
      "on a machine with the CUDA toolkit, or choose naive, flat, hierarchical, two_dimensional or single_node");
}

}  // namespace cohort::comm
