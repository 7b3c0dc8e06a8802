#include "worker/comm/communicators/pure_nccl_communicator.h"

#if COHORT_CUDA
#include "worker/comm/transport/nccl/nccl_transport.h"
#endif

namespace cohort::comm {

#if COHORT_CUDA

PureNcclCommunicator::PureNcclCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank,
                                           uint64_t context_id, CommunicatorOptions options,
                                           std::unique_ptr<NcclTransport> nccl)
    : Communicator("pure_nccl", std::move(world), std::move(global_ranks), rank, context_id, options),
      nccl_(std::move(nccl)) {}

PureNcclCommunicator::~PureNcclCommunicator() = default;

Status PureNcclCommunicator::allreduce_device(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                              Deadline deadline) {
  return nccl_->allreduce(send, recv, count, dtype, op, deadline);
}

Status PureNcclCommunicator::broadcast_device(void* buf, size_t count, DataType dtype, int root, Deadline deadline) {
  return nccl_->broadcast(buf, count, dtype, root, deadline);
}

StatusOr<std::unique_ptr<Communicator>> create_pure_nccl_communicator(std::shared_ptr<CommWorld> world,
                                                                      std::vector<int> global_ranks, int rank,
                                                                      uint64_t context_id,
                                                                      CommunicatorOptions options) {
  NcclOptions nccl_options;
  // One unique id per communicator: the world is context 0, every split gets its own context.
  nccl_options.key_prefix = fmt::format("cohort/nccl/{}", context_id);
  nccl_options.init_timeout = options.timeout;
  StatusOr<std::unique_ptr<NcclTransport>> nccl =
      NcclTransport::create(*world->store, rank, static_cast<int>(global_ranks.size()), nccl_options);
  if (!nccl.ok()) {
    return nccl.status().with_context(fmt::format("pure_nccl communicator (context {}, rank {} of {})", context_id,
                                                  rank, global_ranks.size()));
  }
  return std::unique_ptr<Communicator>(std::make_unique<PureNcclCommunicator>(
      std::move(world), std::move(global_ranks), rank, context_id, options, std::move(*nccl)));
}

#else  // CPU-only build

StatusOr<std::unique_ptr<Communicator>> create_pure_nccl_communicator(std::shared_ptr<CommWorld> /*world*/,
                                                                      std::vector<int> /*global_ranks*/, int /*rank*/,
                                                                      uint64_t /*context_id*/,
                                                                      CommunicatorOptions /*options*/) {
  return failed_precondition_error(
      "pure_nccl needs a CUDA build: bazel build --config=cuda ... (on a machine with the CUDA toolkit and NCCL); "
      "this binary is CPU-only. Choose naive, flat, hierarchical, two_dimensional or single_node instead");
}

#endif

}  // namespace cohort::comm
