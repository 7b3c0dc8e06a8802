#include "worker/comm/algorithms/collectives.h"

#include <cstring>
#include <numeric>

#include "worker/comm/algorithms/algorithm_selector.h"
#include "worker/comm/algorithms/allgather_ring.h"
#include "worker/comm/algorithms/allreduce_halving_doubling.h"
#include "worker/comm/algorithms/allreduce_linear.h"
#include "worker/comm/algorithms/allreduce_recursive_doubling.h"
#include "worker/comm/algorithms/allreduce_ring.h"
#include "worker/comm/algorithms/alltoall_pairwise.h"
#include "worker/comm/algorithms/barrier_dissemination.h"
#include "worker/comm/algorithms/broadcast_binomial.h"
#include "worker/comm/algorithms/broadcast_linear.h"
#include "worker/comm/algorithms/gather_linear.h"
#include "worker/comm/algorithms/reduce_binomial.h"
#include "worker/comm/algorithms/reduce_linear.h"
#include "worker/comm/algorithms/reduce_scatter_ring.h"
#include "worker/comm/algorithms/scatter_linear.h"

namespace cohort::comm {
namespace {

// COHORT_ALGO is read once per process, at the first collective.
const AlgorithmSelector& selector() {
  static const AlgorithmSelector instance([] {
    AlgorithmSelectorOptions options;
    options.read_environment_once = true;
    return options;
  }());
  return instance;
}

Status check_reduction(const CollectiveContext& ctx, DataType dtype, ReduceOp op) {
  COHORT_RETURN_IF_ERROR(check_reduce_op(dtype, op).with_context(ctx.op()));
  if (op == ReduceOp::kAvg) {
    return invalid_argument_error(
        "{}: ReduceOp avg reaches the algorithms only as sum; run sum and then scale_for_average by the "
        "group size",
        ctx.op());
  }
  return ok_status();
}

Status check_root(const CollectiveContext& ctx, int root) {
  if (root >= 0 && root < ctx.size()) return ok_status();
  return invalid_argument_error("{}: root {} is not a rank of this {}-rank group", ctx.op(), root,
                                ctx.size());
}

Status check_per_rank(const CollectiveContext& ctx, const std::vector<size_t>& sizes, const char* what) {
  if (sizes.size() == static_cast<size_t>(ctx.size())) return ok_status();
  return invalid_argument_error("{}: {} has {} entries but the group has {} ranks", ctx.op(), what,
                                sizes.size(), ctx.size());
}

Status check_buffer(const CollectiveContext& ctx, const void* buf, size_t bytes, const char* what) {
  if (buf != nullptr || bytes == 0) return ok_status();
  return invalid_argument_error("{}: rank {}: {} is null but must hold {} bytes", ctx.op(), ctx.rank(), what,
                                bytes);
}

// The selector returned an algorithm this file has no case for: a bug, not a user error.
Status not_dispatched(const CollectiveContext& ctx, Algorithm chosen) {
  return internal_error("{}: algorithm '{}' was selected but has no implementation here", ctx.op(),
                        algorithm_name(chosen));
}

size_t total(const std::vector<size_t>& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), size_t{0});
}

}  // namespace

Status run_allreduce(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op,
                     Algorithm algorithm) {
  COHORT_RETURN_IF_ERROR(check_reduction(ctx, dtype, op));
  const size_t bytes = count * element_size(dtype);
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, buf, bytes, "buf"));
  COHORT_ASSIGN_OR_RETURN(Algorithm chosen,
                          selector().select(Collective::kAllreduce, bytes, ctx.size(), algorithm));
  if (ctx.size() == 1 || count == 0) return ok_status();
  switch (chosen) {
    case Algorithm::kRing:
      return AllreduceRing::run(ctx, buf, count, dtype, op);
    case Algorithm::kHalvingDoubling:
      return AllreduceHalvingDoubling::run(ctx, buf, count, dtype, op);
    case Algorithm::kRecursiveDoubling:
      return AllreduceRecursiveDoubling::run(ctx, buf, count, dtype, op);
    case Algorithm::kLinear:
      return AllreduceLinear::run(ctx, buf, count, dtype, op);
    default:
      return not_dispatched(ctx, chosen);
  }
}

Status run_reduce(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op, int root,
                  Algorithm algorithm) {
  COHORT_RETURN_IF_ERROR(check_reduction(ctx, dtype, op));
  COHORT_RETURN_IF_ERROR(check_root(ctx, root));
  const size_t bytes = count * element_size(dtype);
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, buf, bytes, "buf"));
  COHORT_ASSIGN_OR_RETURN(Algorithm chosen,
                          selector().select(Collective::kReduce, bytes, ctx.size(), algorithm));
  if (ctx.size() == 1 || count == 0) return ok_status();
  switch (chosen) {
    case Algorithm::kBinomialTree:
      return ReduceBinomial::run(ctx, buf, count, dtype, op, root);
    case Algorithm::kLinear:
      return ReduceLinear::run(ctx, buf, count, dtype, op, root);
    default:
      return not_dispatched(ctx, chosen);
  }
}

Status run_broadcast(CollectiveContext& ctx, void* buf, size_t bytes, int root, Algorithm algorithm) {
  COHORT_RETURN_IF_ERROR(check_root(ctx, root));
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, buf, bytes, "buf"));
  COHORT_ASSIGN_OR_RETURN(Algorithm chosen,
                          selector().select(Collective::kBroadcast, bytes, ctx.size(), algorithm));
  if (ctx.size() == 1 || bytes == 0) return ok_status();
  switch (chosen) {
    case Algorithm::kBinomialTree:
      return BroadcastBinomial::run(ctx, buf, bytes, root);
    case Algorithm::kLinear:
      return BroadcastLinear::run(ctx, buf, bytes, root);
    default:
      return not_dispatched(ctx, chosen);
  }
}

Status run_allgatherv(CollectiveContext& ctx, const void* send, void* recv,
                      const std::vector<size_t>& bytes_per_rank, Algorithm algorithm) {
  COHORT_RETURN_IF_ERROR(check_per_rank(ctx, bytes_per_rank, "bytes_per_rank"));
  const size_t bytes = total(bytes_per_rank);
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, send, bytes_per_rank[ctx.rank()], "send"));
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, recv, bytes, "recv"));
  COHORT_ASSIGN_OR_RETURN(Algorithm chosen,
                          selector().select(Collective::kAllgather, bytes, ctx.size(), algorithm));
  if (bytes == 0) return ok_status();
  switch (chosen) {
    case Algorithm::kRing:
      return AllgatherRing::run(ctx, send, recv, bytes_per_rank);  // P = 1: the local copy
    default:
      return not_dispatched(ctx, chosen);
  }
}

Status run_gatherv(CollectiveContext& ctx, const void* send, void* recv,
                   const std::vector<size_t>& bytes_per_rank, int root, Algorithm algorithm) {
  COHORT_RETURN_IF_ERROR(check_root(ctx, root));
  COHORT_RETURN_IF_ERROR(check_per_rank(ctx, bytes_per_rank, "bytes_per_rank"));
  const size_t bytes = total(bytes_per_rank);
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, send, bytes_per_rank[ctx.rank()], "send"));
  if (ctx.rank() == root) COHORT_RETURN_IF_ERROR(check_buffer(ctx, recv, bytes, "recv"));
  COHORT_ASSIGN_OR_RETURN(Algorithm chosen,
                          selector().select(Collective::kGather, bytes, ctx.size(), algorithm));
  if (bytes == 0) return ok_status();
  switch (chosen) {
    case Algorithm::kLinear:
      return GatherLinear::run(ctx, send, recv, bytes_per_rank, root);
    default:
      return not_dispatched(ctx, chosen);
  }
}

Status run_scatterv(CollectiveContext& ctx, const void* send, void* recv,
                    const std::vector<size_t>& bytes_per_rank, int root, Algorithm algorithm) {
  COHORT_RETURN_IF_ERROR(check_root(ctx, root));
  COHORT_RETURN_IF_ERROR(check_per_rank(ctx, bytes_per_rank, "bytes_per_rank"));
  const size_t bytes = total(bytes_per_rank);
  if (ctx.rank() == root) COHORT_RETURN_IF_ERROR(check_buffer(ctx, send, bytes, "send"));
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, recv, bytes_per_rank[ctx.rank()], "recv"));
  COHORT_ASSIGN_OR_RETURN(Algorithm chosen,
                          selector().select(Collective::kScatter, bytes, ctx.size(), algorithm));
  if (bytes == 0) return ok_status();
  switch (chosen) {
    case Algorithm::kLinear:
      return ScatterLinear::run(ctx, send, recv, bytes_per_rank, root);
    default:
      return not_dispatched(ctx, chosen);
  }
}

Status run_reduce_scatter(CollectiveContext& ctx, void* buf, void* out,
                          const std::vector<size_t>& counts_per_rank, DataType dtype, ReduceOp op,
                          Algorithm algorithm) {
  COHORT_RETURN_IF_ERROR(check_reduction(ctx, dtype, op));
  COHORT_RETURN_IF_ERROR(check_per_rank(ctx, counts_per_rank, "counts_per_rank"));
  const size_t element = element_size(dtype);
  const size_t bytes = total(counts_per_rank) * element;
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, buf, bytes, "buf"));
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, out, counts_per_rank[ctx.rank()] * element, "out"));
  COHORT_ASSIGN_OR_RETURN(Algorithm chosen,
                          selector().select(Collective::kReduceScatter, bytes, ctx.size(), algorithm));
  if (bytes == 0) return ok_status();
  switch (chosen) {
    case Algorithm::kRing:
      return ReduceScatterRing::run(ctx, buf, out, counts_per_rank, dtype, op);
    default:
      return not_dispatched(ctx, chosen);
  }
}

Status run_alltoallv(CollectiveContext& ctx, const void* send, const std::vector<size_t>& send_bytes,
                     void* recv, const std::vector<size_t>& recv_bytes, Algorithm algorithm) {
  COHORT_RETURN_IF_ERROR(check_per_rank(ctx, send_bytes, "send_bytes"));
  COHORT_RETURN_IF_ERROR(check_per_rank(ctx, recv_bytes, "recv_bytes"));
  const size_t sending = total(send_bytes);
  const size_t receiving = total(recv_bytes);
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, send, sending, "send"));
  COHORT_RETURN_IF_ERROR(check_buffer(ctx, recv, receiving, "recv"));
  COHORT_ASSIGN_OR_RETURN(Algorithm chosen,
                          selector().select(Collective::kAlltoall, sending, ctx.size(), algorithm));
  if (sending == 0 && receiving == 0) return ok_status();
  switch (chosen) {
    case Algorithm::kPairwise:
      return AlltoallPairwise::run(ctx, send, send_bytes, recv, recv_bytes);
    default:
      return not_dispatched(ctx, chosen);
  }
}

Status run_barrier(CollectiveContext& ctx) {
  if (ctx.size() == 1) return ok_status();
  return BarrierDissemination::run(ctx);
}

}  // namespace cohort::comm
