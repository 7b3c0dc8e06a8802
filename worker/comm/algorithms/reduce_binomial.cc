#include "worker/comm/algorithms/reduce_binomial.h"

#include "worker/comm/algorithms/binomial_tree.h"
#include "worker/comm/algorithms/reduce_exchange.h"

namespace cohort::comm {

Status ReduceBinomial::run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op,
                           int root) {
  if (ctx.size() == 1 || count == 0) return ok_status();
  const BinomialTree tree(ctx.rank(), ctx.size(), root);
  const auto& children = tree.children();
  // Smallest subtree first: those children are ready earliest.
  for (auto child = children.rbegin(); child != children.rend(); ++child) {
    ReduceExchange exchange;
    exchange.dtype = dtype;
    exchange.op = op;
    exchange.recv_peer = *child;
    exchange.accumulate = buf;
    exchange.recv_count = count;
    COHORT_RETURN_IF_ERROR(exchange.run(ctx));
  }
  if (tree.parent() < 0) return ok_status();
  ReduceExchange exchange;
  exchange.dtype = dtype;
  exchange.op = op;
  exchange.send_peer = tree.parent();
  exchange.send = buf;
  exchange.send_count = count;
  return exchange.run(ctx);
}

}  // namespace cohort::comm
