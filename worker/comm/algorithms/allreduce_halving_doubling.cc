#include "worker/comm/algorithms/allreduce_halving_doubling.h"

#include <algorithm>
#include <vector>

#include "worker/comm/algorithms/chunking.h"
#include "worker/comm/algorithms/power_of_two_fold.h"
#include "worker/comm/algorithms/reduce_exchange.h"

namespace cohort::comm {
namespace {

// Tag steps: fold-in, one per level (each level's segments follow), fold-out.
constexpr uint32_t kFoldInStep = 0;
constexpr uint32_t kLevelStepStride = 256;
constexpr uint32_t kFoldOutStep = 1;

}  // namespace

Status AllreduceHalvingDoubling::run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype,
                                     ReduceOp op) {
  if (ctx.size() == 1 || count == 0) return ok_status();
  const size_t element = element_size(dtype);
  auto* base = static_cast<uint8_t*>(buf);
  const PowerOfTwoFold fold(ctx.rank(), ctx.size());
  COHORT_RETURN_IF_ERROR(fold.fold_in(ctx, buf, count, dtype, op, kFoldInStep));

  if (fold.participates()) {
    const int n = fold.virtual_size();
    const int me = fold.virtual_rank();
    // The buffer is n blocks (even_block); ranges [lo, hi) of blocks are always aligned powers
    // of two, so halving is exact and partners' ranges line up.
    auto start = [&](int block) { return block == n ? count : even_block(count, n, block).offset; };
    int lo = 0;
    int hi = n;
    uint32_t level = 1;
    // Reduce-scatter by recursive halving: keep the half holding my virtual rank, send the other.
    for (int mask = n / 2; mask >= 1; mask /= 2, ++level) {
      const int partner = fold.real_rank(me ^ mask);
      const int mid = lo + (hi - lo) / 2;
      const bool upper = (me & mask) != 0;
      const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
      const int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
      ReduceExchange exchange;
      exchange.dtype = dtype;
      exchange.op = op;
      exchange.step = level * kLevelStepStride;
      exchange.send_peer = partner;
      exchange.send = base + start(give_lo) * element;
      exchange.send_count = start(give_hi) - start(give_lo);
      exchange.recv_peer = partner;
      exchange.accumulate = base + start(keep_lo) * element;
      exchange.recv_count = start(keep_hi) - start(keep_lo);
      COHORT_RETURN_IF_ERROR(exchange.run(ctx));
      lo = keep_lo;
      hi = keep_hi;
    }
    // Allgather by recursive doubling: swap fully reduced ranges, doubling them each level.
    for (int mask = 1; mask < n; mask *= 2, ++level) {
      const int partner = fold.real_rank(me ^ mask);
      const int width = hi - lo;
      const int other_lo = (me & mask) != 0 ? lo - width : hi;
      const size_t mine_bytes = (start(hi) - start(lo)) * element;
      const size_t other_bytes = (start(other_lo + width) - start(other_lo)) * element;
      if (mine_bytes > 0 || other_bytes > 0) {
        std::vector<Transfer> transfers;
        if (other_bytes > 0) {
          transfers.push_back(
              ctx.irecv(partner, level * kLevelStepStride, base + start(other_lo) * element, other_bytes));
        }
        if (mine_bytes > 0) {
          transfers.push_back(
              ctx.isend(partner, level * kLevelStepStride, base + start(lo) * element, mine_bytes));
        }
        COHORT_RETURN_IF_ERROR(ctx.wait_all(transfers));
      }
      lo = std::min(lo, other_lo);
      hi = lo + 2 * width;
    }
  }
  return fold.fold_out(ctx, buf, count * element, kFoldOutStep);
}

}  // namespace cohort::comm
