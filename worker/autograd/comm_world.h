#pragma once

// mpi4torch's COMM_WORLD for the differentiable ops: the process's world communicator
// (worker/comm/comm_world.h), built from env:// on first use, as a reference.
//
//   // mpi4torch:  comm = mpi4torch.COMM_WORLD
//   //             res = comm.Allreduce(x, MPI.SUM)
//   comm::Communicator& comm = autograd::comm_world();
//   at::Tensor res = autograd::allreduce(comm, x, comm::ReduceOp::kSum);

#include <stdexcept>
#include <string>

#include "worker/comm/comm_world.h"

namespace cohort::autograd {

// comm::comm_world(), throwing std::runtime_error with its Status text when it cannot be built
// (the ops' error model). Collective on first use; thread-safe.
inline comm::Communicator& comm_world() {
  StatusOr<comm::Communicator*> world = comm::comm_world();
  if (!world.ok()) throw std::runtime_error("cohort autograd: " + world.status().to_string());
  return **world;
}

}  // namespace cohort::autograd
