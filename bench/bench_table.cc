#include "bench/bench_table.h"

#include <cctype>
#include <cstdlib>
#include <utility>

namespace cohort::bench {

double bus_bandwidth_factor(const std::string& op, int ranks) {
  if (ranks <= 1) return op == "broadcast" || op == "reduce" ? 1.0 : 0.0;
  double n = ranks;
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reduce_scatter" || op == "alltoall") return (n - 1) / n;
  return 1.0;  // broadcast, reduce
}

namespace {

size_t round_to_elements(size_t bytes, size_t element_bytes) {
  size_t rounded = bytes / element_bytes * element_bytes;
  return rounded < element_bytes ? element_bytes : rounded;
}

}  // namespace

std::vector<size_t> size_sweep(size_t begin, size_t end, size_t factor, size_t element_bytes) {
  std::vector<size_t> sizes;
  if (factor < 2) factor = 2;
  for (size_t bytes = begin; bytes <= end; bytes *= factor) {
    sizes.push_back(round_to_elements(bytes, element_bytes));
    if (bytes > end / factor) break;
  }
  return sizes;
}

bool parse_size_list(const std::string& text, size_t element_bytes, std::vector<size_t>* sizes) {
  std::vector<size_t> parsed;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    size_t bytes = 0;
    if (!parse_size(text.substr(start, comma - start), &bytes) || bytes == 0) return false;
    parsed.push_back(round_to_elements(bytes, element_bytes));
    start = comma + 1;
  }
  if (parsed.empty()) return false;
  *sizes = std::move(parsed);
  return true;
}

OpCounts op_counts(const std::string& op, size_t count, int ranks) {
  size_t n = ranks > 0 ? static_cast<size_t>(ranks) : 1;
  if (op == "allgather") {
    size_t block = count / n > 0 ? count / n : 1;
    return {block, block * n};
  }
  if (op == "reduce_scatter") return {count, count / n};
  return {count, count};
}

BenchOp bench_op(const std::string& op) {
  if (op == "allreduce") return BenchOp::kAllreduce;
  if (op == "broadcast") return BenchOp::kBroadcast;
  if (op == "reduce") return BenchOp::kReduce;
  if (op == "allgather") return BenchOp::kAllgather;
  if (op == "reduce_scatter") return BenchOp::kReduceScatter;
  if (op == "pingpong") return BenchOp::kPingpong;
  return BenchOp::kAlltoall;
}

size_t block_multiple(const std::string& op, int ranks) {
  return (op == "reduce_scatter" || op == "alltoall") && ranks > 0 ? static_cast<size_t>(ranks) : 1;
}

bool parse_size(const std::string& text, size_t* bytes) {
  if (text.empty()) return false;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || value < 0) return false;
  std::string suffix(end);
  double scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    scale = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty() && suffix != "B")
    return false;
  *bytes = static_cast<size_t>(value * scale);
  return true;
}

int iterations_for(size_t bytes, int base) { return bytes <= (64u << 10) ? base * 10 : base; }

void print_header(std::FILE* out, const std::string& title) {
  std::fprintf(out, "# %s\n", title.c_str());
  std::fprintf(out, "#%13s %13s %8s %7s %6s %11s %8s %8s %7s\n", "size", "count", "type", "redop", "root",
               "time", "algbw", "busbw", "#wrong");
  std::fprintf(out, "#%13s %13s %8s %7s %6s %11s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)",
               "(GB/s)", "(GB/s)", "");
}

void print_row(std::FILE* out, const TableRow& row, const std::string& op, int ranks) {
  double algbw = row.time_us > 0 ? row.bytes / (row.time_us * 1e3) : 0;  // bytes/us/1e3 = GB/s
  double busbw = algbw * bus_bandwidth_factor(op, ranks);
  std::string wrong = row.wrong < 0 ? "N/A" : std::to_string(row.wrong);
  std::fprintf(out, " %13zu %13zu %8s %7s %6d %11.3f %8.2f %8.2f %7s\n", row.bytes, row.count,
               row.type.c_str(), row.redop.c_str(), row.root, row.time_us, algbw, busbw, wrong.c_str());
  std::fflush(out);
}

}  // namespace cohort::bench
