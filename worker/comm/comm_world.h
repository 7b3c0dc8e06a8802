#pragma once

// The process's world communicator, mpi4torch's COMM_WORLD (MPI_COMM_WORLD): nothing to create
// or pass around; the first use builds it from the environment, as torchrun / srun / mpirun /
// a cohort command job set it (env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK, ...;
// see init/init_options.h), with the default kind (kDefaultCommunicatorKind, hierarchical).
//
//   // mpi4torch:  comm = mpi4torch.COMM_WORLD; y = comm.Allreduce(x, MPI.SUM)
//   comm::Communicator& comm = autograd::comm_world();          // worker/autograd/comm_world.h
//   at::Tensor y = autograd::allreduce(comm, x, comm::ReduceOp::kSum);
//
// Every rank must use it (the first use is collective: it joins the job's store and connects the
// transport). It lives until finalize_comm_world() or the end of the process.

#include <string_view>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/communicator_factory.h"
#include "worker/comm/init/init_options.h"

namespace cohort::comm {

// The world communicator; built on the first call (collective and blocking, up to the init
// timeout) from env://, unless init_comm_world built it. Later calls return the same one
// (thread-safe). A failed build is returned to this call and retried by the next one. The
// pointer stays valid until finalize_comm_world().
StatusOr<Communicator*> comm_world();

// Builds the world communicator from `init` with communicators of `kind` instead of env:// and the
// default kind (mpi4py's explicit MPI.Init). Collective and blocking. ALREADY_EXISTS when it
// exists.
Status init_comm_world(const InitOptions& init, std::string_view kind = kDefaultCommunicatorKind,
                       CommunicatorOptions options = {});

// Destroys the world communicator (closing its transport; MPI_Finalize), so a program can end its
// communication before exit. No operation may be in flight on it, and no pointer to it may be
// used afterwards. As after MPI_Finalize, later comm_world() and init_comm_world() calls fail
// (FAILED_PRECONDITION): a second world from the same env:// store would read the first one's
// keys. Without this call the communicator is left to the end of the process (never destroyed by
// a static destructor, whose order relative to the transport's libraries is not defined).
void finalize_comm_world();

}  // namespace cohort::comm
