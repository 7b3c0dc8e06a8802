#pragma once

// NodeInventory: what this machine offers workers — cores, memory, GPUs and its host name — as
// the agent reports it in RegisterNode and NodeInfo.
//
// Cores are those this process may run on (sched_getaffinity, so a cpuset or `taskset` limit is
// honoured), memory is MemTotal from /proc/meminfo, GPUs come from nvidia-smi when it is
// installed. A machine without nvidia-smi (or whose nvidia-smi fails) simply has no GPUs.
//
// Example:
//   COHORT_ASSIGN_OR_RETURN(NodeInventory inventory, probe_node_inventory());
//   LOG_INFO("{} cores, {} GPUs", inventory.cores, inventory.gpus.size());

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "worker/base/status.h"

namespace cohort::agent {

// nvidia-smi answers in well under a second; a wedged driver can make it hang, and the agent
// must still start (without GPUs) rather than wait forever.
inline constexpr int kNvidiaSmiTimeoutSeconds = 10;

struct GpuDevice {
  int index = 0;             // CUDA device index, in nvidia-smi's order
  std::string model;         // e.g. "NVIDIA H100 80GB HBM3"
  int64_t memory_bytes = 0;  // device memory
};

struct NodeInventory {
  std::string hostname;
  int cores = 0;             // CPUs this process may use
  int64_t memory_bytes = 0;  // physical memory
  std::vector<GpuDevice> gpus;
};

// Reads the machine. Blocking (runs nvidia-smi, at most kNvidiaSmiTimeoutSeconds). An error only
// when the basics cannot be read (no /proc/meminfo).
StatusOr<NodeInventory> probe_node_inventory();

// The pieces, exposed for tests.

// MemTotal from /proc/meminfo's text, in bytes.
StatusOr<int64_t> parse_meminfo_total(std::string_view meminfo);
// The output of `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`
// ("NVIDIA H100 80GB HBM3, 81559" per line, memory in MiB). Lines that do not parse are skipped.
std::vector<GpuDevice> parse_nvidia_smi_gpus(std::string_view csv);
// CPUs in this process's affinity mask, else the online CPUs; at least 1.
int available_cores();

}  // namespace cohort::agent
