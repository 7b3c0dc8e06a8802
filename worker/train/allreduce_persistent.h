#pragma once

// Averages a module's persistent values — its buffers, e.g. BatchNorm's running_mean and
// running_var — over all ranks (ChainerMN's AllreducePersistent extension). Data-parallel
// training averages gradients only, so each rank's running statistics drift apart; call this
// before evaluating or checkpointing so every rank holds the same model.
//
//   AllreducePersistent sync_bn(model, *comm);
//   if (iteration % 100 == 0) throw_if_error(sync_bn(), "bn sync");

#include <torch/nn/module.h>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"

namespace cohort::train {

class AllreducePersistent {
 public:
  // `module` and `comm` must outlive this object. Local.
  AllreducePersistent(torch::nn::Module& module, comm::Communicator& comm);

  // Replaces every floating-point buffer of the module (recursively, in named_buffers() order)
  // with its average over the ranks: one allreduce (AVG) per buffer, in place. Integer buffers
  // (BatchNorm's num_batches_tracked) are left alone: they are equal on ranks that step together.
  // Collective and blocking; every rank's module must have the same buffers (names, shapes, dtypes).
  Status operator()();

 private:
  torch::nn::Module& module_;
  comm::Communicator& comm_;
};

}  // namespace cohort::train
