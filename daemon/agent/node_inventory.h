#pragma once

// NodeInventory: what this machine offers workers — cores, memory, GPUs and its host name — as
// the agent reports it in RegisterNode and NodeInfo.
//
// Cores are those this process may run on (sched_getaffinity, so a cpuset or `taskset` limit is
// honoured), memory is MemTotal from /proc/meminfo. GPUs come from nvidia-smi when it is
// installed, else from the driver's /proc/driver/nvidia/gpus/*/information (model only: memory
// then reads 0); a machine with neither simply has no GPUs. Nothing here links CUDA: the agent is
// the same binary on GPU and CPU nodes.
//
// Example:
//   COHORT_ASSIGN_OR_RETURN(NodeInventory inventory, probe_node_inventory());
//   LOG_INFO("{} cores, {} GPUs", inventory.cores, inventory.gpus.size());

#include <cstdint>
#include <functional>
#include <optional>
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

// Where GPU facts come from; a seam so tests feed canned text instead of a machine's.
struct GpuProbeSources {
  // stdout of `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`, or
  // nullopt when nvidia-smi is missing, fails or times out.
  std::function<std::optional<std::string>()> nvidia_smi;
  // The text of every /proc/driver/nvidia/gpus/<pci bus id>/information, in PCI bus order
  // (empty without the driver).
  std::function<std::vector<std::string>()> proc_gpu_information;
};

// The real sources: nvidia-smi on PATH (bounded by kNvidiaSmiTimeoutSeconds) and /proc.
GpuProbeSources system_gpu_probe_sources();

// GPUs per `sources`: nvidia-smi's answer when it gave one, else the /proc files. Blocking as the
// sources are.
std::vector<GpuDevice> probe_gpus(const GpuProbeSources& sources);

// Reads the machine. Blocking (runs nvidia-smi, at most kNvidiaSmiTimeoutSeconds). An error only
// when the basics cannot be read (no /proc/meminfo).
StatusOr<NodeInventory> probe_node_inventory();

// The pieces, exposed for tests.

// MemTotal from /proc/meminfo's text, in bytes.
StatusOr<int64_t> parse_meminfo_total(std::string_view meminfo);
// The output of `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`
// ("0, NVIDIA H100 80GB HBM3, 81559" per line, memory in MiB). The two-column form without the
// index ("NVIDIA H100 80GB HBM3, 81559") is read too, indexes then counting from 0. Lines that do
// not parse are skipped.
std::vector<GpuDevice> parse_nvidia_smi_gpus(std::string_view csv);
// The model of one /proc/driver/nvidia/gpus/*/information file ("Model: \t NVIDIA A100 ..."), or
// nullopt when it has no Model line.
std::optional<std::string> parse_proc_gpu_model(std::string_view information);
// CPUs in this process's affinity mask, else the online CPUs; at least 1.
int available_cores();

}  // namespace cohort::agent
