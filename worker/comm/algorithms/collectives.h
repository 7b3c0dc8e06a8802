#pragma once

// The collective entry points a communicator calls: argument checks, trivial cases (one rank,
// nothing to move), algorithm choice (AlgorithmSelector, a forced Algorithm, COHORT_ALGO), then
// one algorithm class. Buffers are raw bytes with element counts and a DataType; no libtorch.
//
//   std::vector<int> ranks = {...};  // communicator rank → transport rank
//   CollectiveContext ctx(transport, &ranks, my_rank, collective_tag_base(context_id, sequence),
//                         Deadline::after(kDefaultCollectiveTimeout), "allreduce", &scratch);
//   COHORT_RETURN_IF_ERROR(run_allreduce(ctx, data, count, DataType::kFloat32, ReduceOp::kSum));
//
// Common contract:
// - Every rank of the context calls the same entry point with the same sizes, op, root and
//   algorithm (per-rank size vectors identical on every rank).
// - Blocking: returns when this rank's part is done, or fails at the context's deadline with
//   DEADLINE_EXCEEDED naming the peer it waited for; a failed peer gives UNAVAILABLE. After an
//   error the output buffers hold unspecified data.
// - ReduceOp is SUM, PRODUCT, MIN or MAX; AVG is rejected (INVALID_ARGUMENT): the communicator
//   runs SUM and then scale_for_average (worker/comm/reduce/reduce_kernels.h) once.
// - A forced algorithm that does not implement the collective fails with INVALID_ARGUMENT
//   before anything is sent, whatever the sizes.
// - One rank or zero bytes: no messages (barrier excepted); local copies only where the
//   output is a different buffer.
// - Temporary memory comes from ctx.scratch().
// Not thread-safe per context (one collective runs on one thread); different contexts may run
// concurrently.

#include <cstddef>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/algorithm.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

// In place: every rank's `buf` (count elements) becomes the reduction over all ranks.
// Algorithms: ring, halving_doubling, recursive_doubling, linear.
Status run_allreduce(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op,
                     Algorithm algorithm = Algorithm::kAuto);

// The root's `buf` becomes the reduction over all ranks; other ranks' `buf` may be clobbered.
// Algorithms: binomial, linear.
Status run_reduce(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op, int root,
                  Algorithm algorithm = Algorithm::kAuto);

// Every rank's `buf` (`bytes` long) becomes a copy of the root's. Algorithms: binomial, linear.
Status run_broadcast(CollectiveContext& ctx, void* buf, size_t bytes, int root,
                     Algorithm algorithm = Algorithm::kAuto);

// `recv` becomes the concatenation in rank order of every rank's `send` (bytes_per_rank[r]
// bytes from rank r). `send` may be exactly this rank's block of `recv`. Algorithms: ring.
Status run_allgatherv(CollectiveContext& ctx, const void* send, void* recv,
                      const std::vector<size_t>& bytes_per_rank, Algorithm algorithm = Algorithm::kAuto);

// As allgatherv, but only the root's `recv` is written (others may pass null). Algorithms: linear.
Status run_gatherv(CollectiveContext& ctx, const void* send, void* recv,
                   const std::vector<size_t>& bytes_per_rank, int root,
                   Algorithm algorithm = Algorithm::kAuto);

// Rank r's `recv` receives block r (bytes_per_rank[r] bytes) of the root's `send` (blocks in
// rank order; others may pass null). Algorithms: linear.
Status run_scatterv(CollectiveContext& ctx, const void* send, void* recv,
                    const std::vector<size_t>& bytes_per_rank, int root,
                    Algorithm algorithm = Algorithm::kAuto);

// `buf` holds consecutive input blocks of counts_per_rank[r] elements (clobbered); `out`
// (counts_per_rank[rank] elements, not overlapping `buf`) receives this rank's block reduced
// over all ranks. Algorithms: ring.
Status run_reduce_scatter(CollectiveContext& ctx, void* buf, void* out,
                          const std::vector<size_t>& counts_per_rank, DataType dtype, ReduceOp op,
                          Algorithm algorithm = Algorithm::kAuto);

// `send` holds send_bytes[p] bytes for each rank p in rank order; `recv` receives recv_bytes[p]
// bytes from each rank p in rank order. send_bytes[p] here must equal recv_bytes[me] on rank p.
// Algorithms: pairwise.
Status run_alltoallv(CollectiveContext& ctx, const void* send, const std::vector<size_t>& send_bytes,
                     void* recv, const std::vector<size_t>& recv_bytes,
                     Algorithm algorithm = Algorithm::kAuto);

// Returns once every rank has entered the barrier. Dissemination.
Status run_barrier(CollectiveContext& ctx);

}  // namespace cohort::comm
