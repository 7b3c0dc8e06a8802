#include "worker/comm/communicators/pure_nccl_communicator.h"

#include <algorithm>
#include <functional>

#if COHORT_CUDA
#include "worker/comm/transport/nccl/device_memory.h"
#include "worker/comm/transport/nccl/nccl_transport.h"
#endif

namespace cohort::comm {

#if COHORT_CUDA

PureNcclCommunicator::PureNcclCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks,
                                           int rank, uint64_t context_id, CommunicatorOptions options,
                                           std::unique_ptr<NcclTransport> nccl)
    : Communicator("pure_nccl", std::move(world), std::move(global_ranks), rank, context_id, options),
      nccl_(std::move(nccl)) {}

PureNcclCommunicator::~PureNcclCommunicator() { stop_executor(); }

namespace {
bool equal_counts(const std::vector<size_t>& counts) {
  return std::adjacent_find(counts.begin(), counts.end(), std::not_equal_to<>()) == counts.end();
}
}  // namespace

Status run_on_nccl(NcclTransport& nccl, const DeviceCall& call, const std::string& who, Deadline deadline) {
  COHORT_RETURN_IF_ERROR(call.check_all_device(who));
  if (call.collective == Collective::kReduceScatter && call.send == call.recv) {
    return invalid_argument_error(
        "reduce_scatter on {}: NCCL cannot run it with send == recv; pass distinct buffers", who);
  }
  switch (call.collective) {
    case Collective::kAllreduce:
      return nccl.allreduce(call.send, call.recv, call.count, call.dtype, call.op, deadline);
    case Collective::kReduce:
      return nccl.reduce(call.send, call.recv, call.count, call.dtype, call.op, call.root, deadline);
    case Collective::kBroadcast:
      return nccl.broadcast(call.recv, call.count, call.dtype, call.root, deadline);
    case Collective::kAllgather:
      if (!call.recv_counts.empty() && equal_counts(call.recv_counts)) {
        return nccl.allgather(call.send, call.recv, call.recv_counts[0], call.dtype, deadline);
      }
      return nccl.allgatherv(call.send, call.recv, call.recv_counts, call.dtype, deadline);
    case Collective::kGather:
      return nccl.gatherv(call.send, call.recv, call.recv_counts, call.dtype, call.root, deadline);
    case Collective::kScatter:
      return nccl.scatterv(call.send, call.send_counts, call.recv, call.dtype, call.root, deadline);
    case Collective::kReduceScatter:
      if (!call.recv_counts.empty() && equal_counts(call.recv_counts)) {
        return nccl.reduce_scatter(call.send, call.recv, call.recv_counts[0], call.dtype, call.op, deadline);
      }
      return nccl.reduce_scatterv(call.send, call.recv, call.recv_counts, call.dtype, call.op, deadline);
    case Collective::kAlltoall:
      return nccl.alltoallv(call.send, call.send_counts, call.recv, call.recv_counts, call.dtype, deadline);
    case Collective::kBarrier:
      break;
  }
  return internal_error("NCCL has no device form of {}", collective_name(call.collective));
}

Status PureNcclCommunicator::device_collective(const DeviceCall& call, Deadline deadline,
                                               const HostBody& /*host*/) {
  return run_on_nccl(*nccl_, call, description(), deadline);
}

StatusOr<std::unique_ptr<Communicator>> create_pure_nccl_communicator(std::shared_ptr<CommWorld> world,
                                                                      std::vector<int> global_ranks, int rank,
                                                                      uint64_t context_id,
                                                                      CommunicatorOptions options) {
  NcclOptions nccl_options;
  // One unique id per communicator: the world is context 0, every split gets its own context.
  nccl_options.key_prefix = fmt::format("cohort/nccl/{}", context_id);
  nccl_options.init_timeout = options.timeout;
  // This rank's GPU, fixed now on the creating thread (operations run on the executor's); the
  // base class records the same one.
  if (options.cuda_device < 0) options.cuda_device = default_cuda_device();
  nccl_options.device = options.cuda_device;
  StatusOr<std::unique_ptr<NcclTransport>> nccl =
      NcclTransport::create(*world->store, rank, static_cast<int>(global_ranks.size()), nccl_options);
  if (!nccl.ok()) {
    return nccl.status().with_context(fmt::format("pure_nccl communicator (context {}, rank {} of {})",
                                                  context_id, rank, global_ranks.size()));
  }
  return std::unique_ptr<Communicator>(std::make_unique<PureNcclCommunicator>(
      std::move(world), std::move(global_ranks), rank, context_id, options, std::move(*nccl)));
}

#else  // CPU-only build

StatusOr<std::unique_ptr<Communicator>> create_pure_nccl_communicator(std::shared_ptr<CommWorld> /*world*/,
                                                                      std::vector<int> /*global_ranks*/,
                                                                      int /*rank*/, uint64_t /*context_id*/,
                                                                      CommunicatorOptions /*options*/) {
  return failed_precondition_error(
      "pure_nccl needs a CUDA build: bazel build --config=cuda ... (on a machine with the CUDA toolkit and "
      "NCCL); "
      "this binary is CPU-only. Choose naive, flat, hierarchical, two_dimensional or single_node instead");
}

#endif

}  // namespace cohort::comm
