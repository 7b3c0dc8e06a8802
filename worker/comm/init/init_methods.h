#pragma once

// The built-in init methods (env://, tcp://, file://) behind resolve_init, and the env://
// variable reading on its own so tests can check every fallback and error text without
// connecting anywhere.

#include <string>

#include "worker/comm/init/init_options.h"
#include "worker/comm/init/init_url.h"

namespace cohort::comm {

// env:// as read from the environment, before connecting.
struct EnvRendezvous {
  std::string master_address;  // MASTER_ADDR
  int master_port = 0;         // MASTER_PORT
  int rank = -1;               // RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK
  int world_size = -1;         // WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE
  int local_rank = -1;         // LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK; -1: unknown
  int local_world_size = -1;   // LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE (when
                               // every node runs the same number), OMPI_COMM_WORLD_LOCAL_SIZE; -1: unknown
};

// Fields already set in `options` (>= 0) win over the environment; `options.env` must be set.
// INVALID_ARGUMENT naming the variable, its value and what to set when one is missing or garbled.
StatusOr<EnvRendezvous> read_env_rendezvous(const InitOptions& options);

// InitMethods (see init_options.h). env:// and tcp:// serve a TcpStore from rank 0 on the
// master's port (every interface) and connect the others to it; file:// opens a FileStore.
StatusOr<Bootstrap> env_init_method(const InitUrl& url, const InitOptions& options);
StatusOr<Bootstrap> tcp_init_method(const InitUrl& url, const InitOptions& options);
StatusOr<Bootstrap> file_init_method(const InitUrl& url, const InitOptions& options);

}  // namespace cohort::comm
