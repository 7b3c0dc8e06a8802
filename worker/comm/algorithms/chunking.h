#pragma once

// Chunking: how algorithms cut a buffer into per-rank blocks and blocks into pipeline segments.
// Every algorithm derives message sizes from these functions on both ends of a transfer, so a
// sender and its receiver always agree on where a message starts and how long it is.

#include <cstddef>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"

namespace cohort::comm {

// A contiguous piece of a buffer, in elements or bytes as the function says.
struct Span {
  size_t offset = 0;
  size_t size = 0;
};

// Block `index` of `count` elements split into `parts` blocks as evenly as possible: the first
// count % parts blocks hold one element more. Blocks may be empty (count < parts).
Span even_block(size_t count, int parts, int index);

// Offsets of consecutive blocks of the given sizes: offsets[i] = sizes[0] + ... + sizes[i-1].
std::vector<size_t> prefix_offsets(const std::vector<size_t>& sizes);

// ---- Pipelining ----
//
// Large transfers are cut into segments so that each segment is reduced (or forwarded) while it
// is still in cache and while the next ones are on their way, and so that a ring's steps overlap
// instead of running in lock-step. Every segment costs one message: a few µs over UCX shared
// memory (matching, the rendezvous handshake, completion) against ~6-10 µs to copy 64 KiB. The
// bounds keep that overhead around 10% or less.

// Upper bound on a segment. 512 KiB copies in ~50-100 µs at shared-memory bandwidth, so the
// per-message cost is a few percent; kPipelineDepth receive slots of it (2 MiB of scratch) keep
// the slot being reduced in L2. NCCL's Simple protocol moves 512 KiB per pipeline step too.
inline constexpr size_t kMaxSegmentBytes = 512 * 1024;
// Lower bound: splitting below 64 KiB adds messages that cost about as much as the copy they
// would overlap.
inline constexpr size_t kMinSegmentBytes = 64 * 1024;
// Blocks between the bounds are split into about this many segments: enough for the pipeline to
// fill (one segment being reduced, the next ones in flight).
inline constexpr size_t kTargetSegmentsPerBlock = 4;
// Segments a receiver keeps posted ahead (and receive slots of scratch memory it uses).
inline constexpr size_t kPipelineDepth = 4;

// The segment size for pipelining blocks of at most `block_bytes`: a multiple of 64 bytes (so
// of every element size), within [kMinSegmentBytes, kMaxSegmentBytes] unless the block is smaller.
size_t segment_bytes_for(size_t block_bytes);

// Number of segments of `segment_bytes` covering `bytes` (0 for an empty block).
inline size_t segment_count(size_t bytes, size_t segment_bytes) {
  return (bytes + segment_bytes - 1) / segment_bytes;
}

// Segment `index` of a `bytes`-long block, in bytes relative to the block; empty past the end.
inline Span segment_of(size_t bytes, size_t segment_bytes, size_t index) {
  const size_t offset = index * segment_bytes;
  if (offset >= bytes) return Span{bytes, 0};
  return Span{offset, bytes - offset < segment_bytes ? bytes - offset : segment_bytes};
}

// ---- Checks shared by the entry points and the v-collectives ----

// OK when a completed receive got exactly the bytes it was posted for. A shorter message means
// the ranks disagree about per-rank sizes: INVALID_ARGUMENT saying so (longer ones already fail
// in the transport as truncation).
Status check_received_size(const CollectiveContext& ctx, const Transfer& transfer);

}  // namespace cohort::comm
