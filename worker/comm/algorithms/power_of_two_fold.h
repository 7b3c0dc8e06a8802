#pragma once

// PowerOfTwoFold: how the butterfly algorithms (halving-doubling, recursive doubling) run on a
// group whose size is not a power of two (MPICH's scheme).
//
// With size = 2^k + extra, the first 2·extra ranks pair up (0,1), (2,3), ...: each even rank
// hands its whole buffer to its odd neighbour, which reduces it into its own, and sits out. The
// remaining 2^k ranks run the power-of-two algorithm under virtual ranks 0 .. 2^k-1 (odd rank
// 2i+1 → i; rank r ≥ 2·extra → r - extra). At the end each odd rank hands the result back.
// Cost: one extra full-buffer transfer each way on the folded pairs.

#include <cstddef>
#include <cstdint>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

class PowerOfTwoFold {
 public:
  PowerOfTwoFold(int rank, int size);

  // 2^floor(log2(size)).
  int virtual_size() const { return virtual_size_; }
  // This rank's virtual rank, or -1 when it sits out.
  int virtual_rank() const { return virtual_rank_; }
  bool participates() const { return virtual_rank_ >= 0; }
  // The real rank behind a virtual rank.
  int real_rank(int virtual_rank) const {
    return virtual_rank < extra_ ? 2 * virtual_rank + 1 : virtual_rank + extra_;
  }

  // Folds the extra ranks in: a sitting-out rank sends `buf`, its partner reduces it into its
  // own `buf`. No-op for other ranks. Blocking, bounded by the context's deadline.
  Status fold_in(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op,
                 uint32_t step) const;
  // Hands the result back: a partner sends its `buf` (`bytes` long), the sitting-out rank
  // receives it into its own.
  Status fold_out(CollectiveContext& ctx, void* buf, size_t bytes, uint32_t step) const;

 private:
  const int rank_;
  int virtual_size_ = 1;
  int extra_ = 0;
  int virtual_rank_ = -1;
};

}  // namespace cohort::comm
