#pragma once

// What env:// reads from the launcher when MASTER_ADDR / MASTER_PORT are not set.
//
// - srun: every task of a step knows the step's node list and the job and step ids, so all of
//   them compute the same meeting point without talking: the first host of
//   SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) and a port derived from SLURM_JOB_ID and
//   SLURM_STEP_ID (slurm_step_port). Under srun's default block distribution (and cyclic too)
//   task 0 runs on the first node of the step; rank 0 checks that (SLURM_NODEID == 0) and
//   otherwise asks for MASTER_ADDR. The node list holds Slurm's NodeNames: where a NodeName does
//   not resolve to its node (NodeAddr differs and DNS does not know the name), set MASTER_ADDR.
// - mpirun (Open MPI): OMPI_COMM_WORLD_* give ranks but no address anyone can meet at, so
//   env:// without MASTER_ADDR fails and says to pass a file:// or tcp:// init URL, which then
//   takes the ranks from OMPI_COMM_WORLD_*.
//
// mpirun inside a Slurm allocation inherits SLURM_PROCID from the surrounding step; the
// OMPI_COMM_WORLD_* variables describe this process and win (see launched_by_srun).

#include <cstdint>
#include <string>

#include "worker/base/status.h"
#include "worker/comm/init/environment.h"

namespace cohort::comm {

// Ports derived under srun: kSlurmPortBase + a block of kSlurmPortsPerJob per job id (modulo
// the range), one port per step id within the block (modulo kSlurmPortsPerJob). 20000..31999
// stays below Linux's ephemeral range (32768..60999), so an outgoing connection never holds
// it. Jobs whose ids differ by a multiple of kSlurmPortRange / kSlurmPortsPerJob (750) and
// share rank 0's node, or steps of one job 16 apart running at once, would collide: set
// MASTER_PORT for those.
constexpr int kSlurmPortBase = 20000;
constexpr int kSlurmPortRange = 12000;
constexpr int kSlurmPortsPerJob = 16;

// The port every task of step `step_id` of job `job_id` derives.
int slurm_step_port(uint64_t job_id, uint64_t step_id);

// True when Open MPI's mpirun started this process (OMPI_COMM_WORLD_RANK is set).
bool launched_by_mpirun(const EnvLookup& env);

// True when srun started this process: SLURM_JOB_ID and SLURM_PROCID are set and mpirun did
// not start it (launched_by_mpirun is false).
bool launched_by_srun(const EnvLookup& env);

// MASTER_ADDR under srun: the first host of SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST.
// INVALID_ARGUMENT, naming the variable and saying to set MASTER_ADDR, when neither is set, the
// list is malformed, or this is rank 0 (SLURM_PROCID=0) on a node other than the first
// (SLURM_NODEID != 0, e.g. srun -m arbitrary). Does not resolve the name.
StatusOr<std::string> slurm_master_address(const EnvLookup& env);

// MASTER_PORT under srun: slurm_step_port(SLURM_JOB_ID, SLURM_STEP_ID) (SLURM_STEPID, the older
// name, if SLURM_STEP_ID is unset; step 0 if neither is, e.g. in a batch script).
// INVALID_ARGUMENT naming the variable when SLURM_JOB_ID is missing or either is not a number.
StatusOr<int> slurm_master_port(const EnvLookup& env);

// The error env:// gives under mpirun without MASTER_ADDR: which init URL to pass instead, with
// an example command line.
Status mpirun_without_master_address_error(const EnvLookup& env);

}  // namespace cohort::comm
