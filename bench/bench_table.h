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
