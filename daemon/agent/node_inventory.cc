#include "daemon/agent/node_inventory.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <unistd.h>

#include <cstdlib>
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

std::vector<GpuDevice> probe_gpus() {
  std::string nvidia_smi = find_on_path("nvidia-smi");
  if (nvidia_smi.empty()) return {};
  std::string timeout = find_on_path("timeout");
  std::string command = fmt::format(
      "{}'{}' --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null",
      timeout.empty() ? "" : fmt::format("'{}' {} ", timeout, kNvidiaSmiTimeoutSeconds), nvidia_smi);
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return {};
  std::string output;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  int status = ::pclose(pipe);
  if (status != 0) return {};  // no driver, no devices, or timed out: a node without GPUs
  return parse_nvidia_smi_gpus(output);
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
    size_t comma = line.rfind(',');
    if (comma == std::string::npos) continue;
    std::string model = trim(std::string_view(line).substr(0, comma));
    std::string memory = trim(std::string_view(line).substr(comma + 1));
    char* end = nullptr;
    long long mib = std::strtoll(memory.c_str(), &end, 10);
    if (model.empty() || end == memory.c_str() || *end != '\0' || mib < 0) continue;
    GpuDevice gpu;
    gpu.index = static_cast<int>(gpus.size());
    gpu.model = model;
    gpu.memory_bytes = static_cast<int64_t>(mib) * kMiB;
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
  inventory.gpus = probe_gpus();
  return inventory;
}

}  // namespace cohort::agent
