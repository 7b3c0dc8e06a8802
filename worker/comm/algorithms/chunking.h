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
// Large transfers are cut into segments so that the reduction (or forwarding) of one segment
// overlaps the transfer of the next. A segment is large enough that per-message overhead
// (matching, a UCX rendezvous handshake: a few µs) is small against its copy time, and small
// enough that a pipeline of them fills quickly and the receive slots stay in L2.

// Upper bound on a segment: 256 KiB copies in ~25 µs at shared-memory bandwidth, so a 2-5 µs
// per-message cost stays under ~15%; kPipelineDepth slots of it (1 MiB) fit in L2.
inline constexpr size_t kMaxSegmentBytes = 256 * 1024;
// Lower bound: below ~32 KiB the per-message cost dominates, so splitting further only hurts.
inline constexpr size_t kMinSegmentBytes = 32 * 1024;
// Blocks between the bounds are split into about this many segments, enough for the pipeline to
// overlap the reduction of one segment with the transfer of the next.
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
