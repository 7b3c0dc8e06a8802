#include "daemon/agent/node_inventory.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace cohort::agent {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * 1024;

std::string trim(std::string_view s) {
  size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string_view::npos) return "";
  size_t end = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(begin, end - begin + 1));
}

// The first executable `name` on PATH, or "" (no PATH search happens in popen's shell for an
// absolute path, and a missing tool must not print "not found" into the agent's log).
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  std::stringstream stream(dirs);
  std::string dir;
  while (std::getline(stream, dir, ':')) {
    if (dir.empty()) continue;
    std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Runs nvidia-smi with a time limit; nullopt when it is missing or fails.
std::optional<std::string> run_nvidia_smi() {
  std::string nvidia_smi = find_on_path("nvidia-smi");
  if (nvidia_smi.empty()) return std::nullopt;
  std::string timeout = find_on_path("timeout");
  std::string command = fmt::format(
      "{}'{}' --query-gpu=index,name,memory.total --format=csv,noheader,nounits 2>/dev/null",
      timeout.empty() ? "" : fmt::format("'{}' {} ", timeout, kNvidiaSmiTimeoutSeconds), nvidia_smi);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  int status = ::pclose(pipe);
  if (status != 0) return std::nullopt;  // no driver, no devices, or timed out
  return output;
}

// Every /proc/driver/nvidia/gpus/<bus id>/information, sorted by bus id (nvidia-smi's order).
std::vector<std::string> read_proc_gpu_information() {
  std::vector<std::string> texts;
  std::error_code error;
  const std::filesystem::path root("/proc/driver/nvidia/gpus");
  if (!std::filesystem::is_directory(root, error)) return texts;
  std::vector<std::filesystem::path> dirs;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) dirs.push_back(entry.path());
  std::sort(dirs.begin(), dirs.end());
  for (const auto& dir : dirs) {
    std::ifstream file(dir / "information");
    if (!file) continue;
    std::stringstream text;
    text << file.rdbuf();
    texts.push_back(text.str());
  }
  return texts;
}

}  // namespace

StatusOr<int64_t> parse_meminfo_total(std::string_view meminfo) {
  std::istringstream lines{std::string(meminfo)};
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::istringstream fields(line.substr(9));
    int64_t value = 0;
    std::string unit;
    if (!(fields >> value) || value <= 0) break;
    fields >> unit;
    return unit == "kB" ? value * kKiB : value;
  }
  return internal_error("no MemTotal line in /proc/meminfo; is /proc mounted?");
}

std::vector<GpuDevice> parse_nvidia_smi_gpus(std::string_view csv) {
  std::vector<GpuDevice> gpus;
  std::istringstream lines{std::string(csv)};
  std::string line;
  while (std::getline(lines, line)) {
    size_t last = line.rfind(',');
    if (last == std::string::npos) continue;
    std::string head = trim(std::string_view(line).substr(0, last));
    std::string memory = trim(std::string_view(line).substr(last + 1));
    // "index, name": the index is the text before the first comma when it is a number (model
    // names do not start with a number followed by a comma).
    int index = static_cast<int>(gpus.size());
    size_t first = head.find(',');
    if (first != std::string::npos) {
      std::string index_text = trim(std::string_view(head).substr(0, first));
      char* index_end = nullptr;
      long value = std::strtol(index_text.c_str(), &index_end, 10);
      if (!index_text.empty() && *index_end == '\0' && value >= 0) {
        index = static_cast<int>(value);
        head = trim(std::string_view(head).substr(first + 1));
      }
    }
    char* end = nullptr;
    long long mib = std::strtoll(memory.c_str(), &end, 10);
    if (head.empty() || end == memory.c_str() || *end != '\0' || mib < 0) continue;
    GpuDevice gpu;
    gpu.index = index;
    gpu.model = head;
    gpu.memory_bytes = static_cast<int64_t>(mib) * kMiB;
    gpus.push_back(gpu);
  }
  return gpus;
}

std::optional<std::string> parse_proc_gpu_model(std::string_view information) {
  std::istringstream lines{std::string(information)};
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("Model:", 0) != 0) continue;
    std::string model = trim(std::string_view(line).substr(6));
    if (!model.empty()) return model;
  }
  return std::nullopt;
}

GpuProbeSources system_gpu_probe_sources() { return GpuProbeSources{run_nvidia_smi, read_proc_gpu_information}; }

std::vector<GpuDevice> probe_gpus(const GpuProbeSources& sources) {
  if (sources.nvidia_smi) {
    if (std::optional<std::string> csv = sources.nvidia_smi(); csv.has_value()) return parse_nvidia_smi_gpus(*csv);
  }
  std::vector<GpuDevice> gpus;
  if (!sources.proc_gpu_information) return gpus;
  for (const std::string& information : sources.proc_gpu_information()) {
    std::optional<std::string> model = parse_proc_gpu_model(information);
    if (!model.has_value()) continue;
    GpuDevice gpu;
    gpu.index = static_cast<int>(gpus.size());
    gpu.model = *model;
    gpu.memory_bytes = 0;  // the driver's /proc files do not say
    gpus.push_back(gpu);
  }
  return gpus;
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
  long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

StatusOr<NodeInventory> probe_node_inventory() {
  NodeInventory inventory;
  char hostname[HOST_NAME_MAX + 1] = {};
  if (::gethostname(hostname, sizeof(hostname) - 1) != 0) {
    return errno_status("gethostname", errno);
  }
  inventory.hostname = hostname;
  inventory.cores = available_cores();
  std::ifstream meminfo("/proc/meminfo");
  if (!meminfo) return not_found_error("cannot open /proc/meminfo; is /proc mounted?");
  std::stringstream text;
  text << meminfo.rdbuf();
  COHORT_ASSIGN_OR_RETURN(inventory.memory_bytes, parse_meminfo_total(text.str()));
  inventory.gpus = probe_gpus(system_gpu_probe_sources());
  return inventory;
}

}  // namespace cohort::agent
