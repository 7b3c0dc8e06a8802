#include "worker/comm/algorithms/allreduce_recursive_doubling.h"

#include "worker/comm/algorithms/power_of_two_fold.h"
#include "worker/comm/algorithms/reduce_exchange.h"

namespace cohort::comm {
namespace {

constexpr uint32_t kFoldInStep = 0;
constexpr uint32_t kLevelStepStride = 256;
constexpr uint32_t kFoldOutStep = 1;

}  // namespace

Status AllreduceRecursiveDoubling::run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype,
                                       ReduceOp op) {
  if (ctx.size() == 1 || count == 0) return ok_status();
  const PowerOfTwoFold fold(ctx.rank(), ctx.size());
  COHORT_RETURN_IF_ERROR(fold.fold_in(ctx, buf, count, dtype, op, kFoldInStep));
  if (fold.participates()) {
    uint32_t level = 1;
    for (int mask = 1; mask < fold.virtual_size(); mask *= 2, ++level) {
      const int partner = fold.real_rank(fold.virtual_rank() ^ mask);
      ReduceExchange exchange;
      exchange.dtype = dtype;
      exchange.op = op;
      exchange.step = level * kLevelStepStride;
      exchange.send_peer = partner;
      exchange.send = buf;
      exchange.send_count = count;
      exchange.recv_peer = partner;
      exchange.accumulate = buf;  // same region: each segment is reduced once its send is done
      exchange.recv_count = count;
      COHORT_RETURN_IF_ERROR(exchange.run(ctx));
    }
  }
  return fold.fold_out(ctx, buf, count * element_size(dtype), kFoldOutStep);
}

}  // namespace cohort::comm
