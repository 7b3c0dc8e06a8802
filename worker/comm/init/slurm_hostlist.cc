#include "worker/comm/init/slurm_hostlist.h"

#include <charconv>
#include <cstdint>

#include <fmt/format.h>

namespace cohort::comm {
namespace {

// Longest number in a range: 18 digits always fit in uint64_t, and no host is numbered higher.
constexpr size_t kMaxRangeDigits = 18;

// What a node list looks like, appended to every error.
constexpr const char* kSyntaxHint = "Slurm writes node lists like node[01-04,07],gpu3";

bool all_digits(std::string_view text) {
  if (text.empty() || text.size() > kMaxRangeDigits) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

uint64_t to_number(std::string_view digits) {
  uint64_t value = 0;
  std::from_chars(digits.data(), digits.data() + digits.size(), value);  // all_digits checked it
  return value;
}

// Parses one bracket group's content ("01-04,07") starting at character `offset` of `list`.
class BracketParser {
 public:
  BracketParser(std::string_view list, size_t offset, size_t max_hosts)
      : list_(list), offset_(offset), max_hosts_(max_hosts) {}

  StatusOr<std::vector<std::string>> parse(std::string_view content) {
    std::vector<std::string> values;
    size_t start = 0;
    while (start <= content.size()) {
      size_t comma = content.find(',', start);
      if (comma == std::string_view::npos) comma = content.size();
      COHORT_RETURN_IF_ERROR(add_range(content.substr(start, comma - start), offset_ + start, &values));
      start = comma + 1;
    }
    return values;
  }

 private:
  Status error(size_t at, std::string_view what) const {
    return invalid_argument_error("Slurm node list {:?}: {} at character {}; {}", list_, what, at + 1,
                                  kSyntaxHint);
  }

  // "07" or "01-04", at character `at` of the list.
  Status add_range(std::string_view range, size_t at, std::vector<std::string>* values) {
    if (range.empty()) return error(at, "empty number in [...]");
    const size_t dash = range.find('-');
    const std::string_view lo_text = range.substr(0, dash);
    const std::string_view hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
    if (!all_digits(lo_text) || !all_digits(hi_text)) {
      return error(
          at, fmt::format("{:?} is not a number or lo-hi range of up to {} digits", range, kMaxRangeDigits));
    }
    const uint64_t lo = to_number(lo_text);
    const uint64_t hi = to_number(hi_text);
    if (lo > hi) return error(at, fmt::format("range {:?} runs backwards", range));
    if (hi - lo >= max_hosts_ - std::min(values->size(), max_hosts_)) {
      return error(
          at, fmt::format("range {:?} makes more than {} hosts (kMaxSlurmHostlistHosts)", range, max_hosts_));
    }
    // Slurm pads every number of a range to the width of its low end.
    for (uint64_t n = lo; n <= hi; ++n) values->push_back(fmt::format("{:0{}}", n, lo_text.size()));
    return ok_status();
  }

  std::string_view list_;
  size_t offset_;
  size_t max_hosts_;
};

// Expands one entry ("rack[1-2]-n[01-02]") starting at character `offset` of `list` into `hosts`.
Status expand_entry(std::string_view list, std::string_view entry, size_t offset, size_t max_hosts,
                    std::vector<std::string>* hosts) {
  auto error = [&](size_t at, std::string_view what) {
    return invalid_argument_error("Slurm node list {:?}: {} at character {}; {}", list, what, offset + at + 1,
                                  kSyntaxHint);
  };
  auto too_many = [&](size_t at) {
    return error(at, fmt::format("the list makes more than {} hosts (kMaxSlurmHostlistHosts)", max_hosts));
  };
  if (entry.empty()) return error(0, "empty host name");
  // The entry as a sequence of choices: a literal is a choice of one.
  std::vector<std::vector<std::string>> parts;
  size_t pos = 0;
  size_t combinations = 1;
  while (pos < entry.size()) {
    const size_t open = entry.find_first_of("[]", pos);
    if (open == std::string_view::npos) {
      parts.push_back({std::string(entry.substr(pos))});
      break;
    }
    if (entry[open] == ']') return error(open, "']' without '['");
    if (open > pos) parts.push_back({std::string(entry.substr(pos, open - pos))});
    const size_t close = entry.find_first_of("[]", open + 1);
    if (close == std::string_view::npos) return error(open, "'[' is never closed");
    if (entry[close] == '[') return error(close, "nested '['");
    COHORT_ASSIGN_OR_RETURN(
        std::vector<std::string> values,
        BracketParser(list, offset + open + 1, max_hosts).parse(entry.substr(open + 1, close - open - 1)));
    if (combinations > max_hosts / values.size()) return too_many(open);
    combinations *= values.size();
    parts.push_back(std::move(values));
    pos = close + 1;
  }
  if (combinations > max_hosts - hosts->size()) return too_many(0);
  // Every combination, the first group varying slowest (an odometer over the parts).
  std::vector<size_t> index(parts.size(), 0);
  for (size_t n = 0; n < combinations; ++n) {
    std::string host;
    for (size_t p = 0; p < parts.size(); ++p) host += parts[p][index[p]];
    hosts->push_back(std::move(host));
    for (size_t p = parts.size(); p-- > 0;) {
      if (++index[p] < parts[p].size()) break;
      index[p] = 0;
    }
  }
  return ok_status();
}

}  // namespace

StatusOr<std::vector<std::string>> expand_slurm_hostlist(std::string_view hostlist, size_t max_hosts) {
  if (hostlist.empty()) {
    return invalid_argument_error("Slurm node list is empty; {}", kSyntaxHint);
  }
  for (size_t i = 0; i < hostlist.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(hostlist[i]);
    if (c <= ' ' || c >= 0x7f) {
      return invalid_argument_error("Slurm node list {:?}: unexpected character {:?} at character {}; {}",
                                    hostlist, hostlist.substr(i, 1), i + 1, kSyntaxHint);
    }
  }
  std::vector<std::string> hosts;
  size_t start = 0;
  int depth = 0;
  // Entries end at commas outside brackets; bracket errors are reported by expand_entry.
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    if (i < hostlist.size()) {
      if (hostlist[i] == '[') ++depth;
      if (hostlist[i] == ']' && depth > 0) --depth;
      if (hostlist[i] != ',' || depth > 0) continue;
    }
    COHORT_RETURN_IF_ERROR(
        expand_entry(hostlist, hostlist.substr(start, i - start), start, max_hosts, &hosts));
    start = i + 1;
  }
  return hosts;
}

}  // namespace cohort::comm
