#include "worker/comm/init/launcher_environment.h"

#include <charconv>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "worker/comm/init/slurm_hostlist.h"

namespace cohort::comm {
namespace {

static_assert(kSlurmPortRange % kSlurmPortsPerJob == 0, "whole blocks of ports per job");
static_assert(kSlurmPortBase + kSlurmPortRange <= 32768, "derived ports stay below the ephemeral range");

constexpr const char* kSetMasterAddr =
    "set MASTER_ADDR to the host name or IP address of the node running rank 0 (e.g. "
    "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1))";

bool is_set(const EnvLookup& env, const char* name) { return env(name).has_value(); }

std::optional<uint64_t> parse_uint(std::string_view text) {
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

int slurm_step_port(uint64_t job_id, uint64_t step_id) {
  constexpr uint64_t kBlocks = kSlurmPortRange / kSlurmPortsPerJob;
  return kSlurmPortBase +
         static_cast<int>((job_id % kBlocks) * kSlurmPortsPerJob + step_id % kSlurmPortsPerJob);
}

bool launched_by_mpirun(const EnvLookup& env) { return is_set(env, "OMPI_COMM_WORLD_RANK"); }

bool launched_by_srun(const EnvLookup& env) {
  return is_set(env, "SLURM_JOB_ID") && is_set(env, "SLURM_PROCID") && !launched_by_mpirun(env);
}

StatusOr<std::string> slurm_master_address(const EnvLookup& env) {
  const char* variable = "SLURM_STEP_NODELIST";
  std::optional<std::string> list = env(variable);
  if (!list) {
    variable = "SLURM_JOB_NODELIST";
    list = env(variable);
  }
  if (!list) {
    return invalid_argument_error(
        "env:// init under srun: MASTER_ADDR is not set and neither SLURM_STEP_NODELIST nor "
        "SLURM_JOB_NODELIST is; {}",
        kSetMasterAddr);
  }
  StatusOr<std::vector<std::string>> hosts = expand_slurm_hostlist(*list);
  if (!hosts.ok()) {
    return hosts.status()
        .with_context(fmt::format(
            "env:// init under srun: MASTER_ADDR is not set, so rank 0's host comes from {}", variable))
        .with_suffix(fmt::format("; or {}", kSetMasterAddr));
  }
  // Task 0 sits on the step's first node under block and cyclic distribution; not necessarily
  // under -m arbitrary or plane. Rank 0 knows its node index and says so; the others cannot tell
  // and would only time out connecting.
  const std::optional<std::string> procid = env("SLURM_PROCID");
  const std::optional<std::string> nodeid = env("SLURM_NODEID");
  if (procid && *procid == "0" && nodeid && *nodeid != "0") {
    return invalid_argument_error(
        "env:// init under srun: rank 0 runs on node {} of {}={} (SLURM_NODEID={}), not on its first host "
        "{}, "
        "so the other ranks cannot find it (a distribution other than block or cyclic?); {}",
        *nodeid, variable, *list, *nodeid, hosts->front(), kSetMasterAddr);
  }
  return hosts->front();
}

StatusOr<int> slurm_master_port(const EnvLookup& env) {
  const std::optional<std::string> job = env("SLURM_JOB_ID");
  const char* step_variable = is_set(env, "SLURM_STEP_ID") ? "SLURM_STEP_ID" : "SLURM_STEPID";
  const std::optional<std::string> step = env(step_variable);
  const char* set_port = "set MASTER_PORT to a free TCP port on rank 0's node (e.g. 29500)";
  if (!job) {
    return invalid_argument_error("env:// init under srun: MASTER_PORT and SLURM_JOB_ID are not set; {}",
                                  set_port);
  }
  const std::optional<uint64_t> job_id = parse_uint(*job);
  if (!job_id) {
    return invalid_argument_error(
        "env:// init under srun: SLURM_JOB_ID={:?} is not a number, so no port can be derived from it; {}",
        *job, set_port);
  }
  std::optional<uint64_t> step_id = uint64_t{0};
  if (step) step_id = parse_uint(*step);
  if (!step_id) {
    return invalid_argument_error(
        "env:// init under srun: {}={:?} is not a number, so no port can be derived from it; {}",
        step_variable, *step, set_port);
  }
  return slurm_step_port(*job_id, *step_id);
}

Status mpirun_without_master_address_error(const EnvLookup& env) {
  const std::optional<std::string> rank = env("OMPI_COMM_WORLD_RANK");
  return invalid_argument_error(
      "env:// init under mpirun (OMPI_COMM_WORLD_RANK={}): MASTER_ADDR is not set, and Open MPI tells no "
      "process where rank 0 is, so there is no address to meet at. Pass a store every rank can reach as the "
      "init URL (--init for cohort-worker and cohort-bench; ranks then come from OMPI_COMM_WORLD_*): "
      "file:///path/on/a/shared/filesystem (a new file for each run that every rank can open; on one host "
      "any "
      "local path), e.g. "
      "`mpirun -np 2 cohort-bench --init file:///shared/$USER/job1.store`, or tcp://HOST:PORT (rank 0 must "
      "run on HOST and serves the store on PORT), e.g. `mpirun -np 2 --host node1,node2 cohort-bench --init "
      "tcp://node1:29500`; or export MASTER_ADDR and MASTER_PORT to every rank (`mpirun -x "
      "MASTER_ADDR=node1 -x MASTER_PORT=29500 ...`)",
      rank.value_or("?"));
}

}  // namespace cohort::comm
