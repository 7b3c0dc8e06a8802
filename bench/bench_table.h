#pragma once

// The results table of cohort-bench and its peers, in nccl-tests' conventions:
//   size (B), count (elements), type, redop, root, time (us), algbw (GB/s), busbw (GB/s), #wrong
// busbw = algbw × a per-collective factor, so numbers compare across rank counts:
//   allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n; broadcast, reduce 1.
// No cohort dependency: the MPI baseline prints the same table.

#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace cohort::bench {

// The busbw factor of `op` ("allreduce", "allgather", ...) at `ranks` ranks.
double bus_bandwidth_factor(const std::string& op, int ranks);

// Sizes from `begin` to `end` bytes, multiplying by `factor` (nccl-tests' -b/-e/-f), each rounded
// down to a multiple of `element_bytes` and at least one element.
std::vector<size_t> size_sweep(size_t begin, size_t end, size_t factor, size_t element_bytes);

// Parses "8", "64K", "64M", "1G" (powers of 1024). Returns false on garbage.
bool parse_size(const std::string& text, size_t* bytes);

// Parses a comma-separated list of sizes, "8,1K,64K,1M" (--sizes), each rounded down to a multiple
// of `element_bytes` and at least one element, as size_sweep rounds. Returns false on garbage or
// an empty list. The size points (8 B, 1 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB) are no
// geometric sweep, so cohort-bench and its peers take the list directly.
bool parse_size_list(const std::string& text, size_t element_bytes, std::vector<size_t>* sizes);

// Element counts of one rank's buffers for `op` at `count` elements (the row's size), shared by
// cohort-bench and its MPI peer so both move the same bytes: allgather sends count/ranks (at
// least 1) and receives that times ranks; reduce_scatter sends count and receives count/ranks
// (count is a multiple of ranks: the size list and sweep round to element_bytes × ranks);
// allreduce, broadcast, reduce and alltoall send and receive count.
struct OpCounts {
  size_t send = 0;
  size_t recv = 0;
};
OpCounts op_counts(const std::string& op, size_t count, int ranks);

// An --op name resolved once, so that the timed loops of cohort-bench and mpi_baseline branch on
// a number instead of comparing strings on every call (which at 8 B was a tenth of a call).
enum class BenchOp { kAllreduce, kBroadcast, kReduce, kAllgather, kReduceScatter, kAlltoall, kPingpong };
// The op named `op` (one of the names the tools accept; anything else is alltoall, the last).
BenchOp bench_op(const std::string& op);

// Ops whose buffers hold one block per rank: sizes must be multiples of element_bytes × ranks.
size_t block_multiple(const std::string& op, int ranks);

struct TableRow {
  size_t bytes = 0;
  size_t count = 0;
  std::string type;
  std::string redop;
  int root = -1;
  double time_us = 0;
  long wrong = 0;  // -1: not checked
};

// Timed iterations at `bytes`: `base` for large messages, 10× for ≤ 64 KiB where one call takes
// microseconds and timer noise would dominate. cohort-bench and its peers share this rule.
int iterations_for(size_t bytes, int base);

void print_header(std::FILE* out, const std::string& title);
void print_row(std::FILE* out, const TableRow& row, const std::string& op, int ranks);

}  // namespace cohort::bench
