#include "bench/bench_table.h"

#include <cctype>
#include <cstdlib>

namespace cohort::bench {

double bus_bandwidth_factor(const std::string& op, int ranks) {
  if (ranks <= 1) return op == "broadcast" || op == "reduce" ? 1.0 : 0.0;
  double n = ranks;
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather" || op == "reduce_scatter" || op == "alltoall") return (n - 1) / n;
  return 1.0;  // broadcast, reduce
}

std::vector<size_t> size_sweep(size_t begin, size_t end, size_t factor, size_t element_bytes) {
  std::vector<size_t> sizes;
  if (factor < 2) factor = 2;
  for (size_t bytes = begin; bytes <= end; bytes *= factor) {
    size_t rounded = bytes / element_bytes * element_bytes;
    sizes.push_back(rounded < element_bytes ? element_bytes : rounded);
    if (bytes > end / factor) break;
  }
  return sizes;
}

bool parse_size(const std::string& text, size_t* bytes) {
  if (text.empty()) return false;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || value < 0) return false;
  std::string suffix(end);
  double scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") scale = 1024.0;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty() && suffix != "B") return false;
  *bytes = static_cast<size_t>(value * scale);
  return true;
}

int iterations_for(size_t bytes, int base) { return bytes <= (64u << 10) ? base * 10 : base; }

void print_header(std::FILE* out, const std::string& title) {
  std::fprintf(out, "# %s\n", title.c_str());
  std::fprintf(out, "#%13s %13s %8s %7s %6s %11s %8s %8s %7s\n", "size", "count", "type", "redop", "root", "time",
               "algbw", "busbw", "#wrong");
  std::fprintf(out, "#%13s %13s %8s %7s %6s %11s %8s %8s %7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
               "(GB/s)", "");
}

void print_row(std::FILE* out, const TableRow& row, const std::string& op, int ranks) {
  double algbw = row.time_us > 0 ? row.bytes / (row.time_us * 1e3) : 0;  // bytes/us/1e3 = GB/s
  double busbw = algbw * bus_bandwidth_factor(op, ranks);
  std::string wrong = row.wrong < 0 ? "N/A" : std::to_string(row.wrong);
  std::fprintf(out, " %13zu %13zu %8s %7s %6d %11.2f %8.2f %8.2f %7s\n", row.bytes, row.count, row.type.c_str(),
               row.redop.c_str(), row.root, row.time_us, algbw, busbw, wrong.c_str());
  std::fflush(out);
}

}  // namespace cohort::bench
