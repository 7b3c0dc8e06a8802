#pragma once

// PyTorch's "Writing Distributed Applications" tutorial, ported line by line to
// cohort::distributed (worker/distributed/process_group.h). Each function is one rank's part of
// one of the tutorial's programs over `world`; it prints the tutorial's lines to `out` ("Rank 1
// has data 1", the tutorial's print without torch's tensor(...) wrapper). The programs run as
// binaries (tutorial_main.cc: `tutorial_p2p --ranks 2`) and in tutorial_programs_test.
//
//   Python (tutorial)                               cohort
//   dist.send(tensor=tensor, dst=1)                 dist::send(world, tensor, 1);
//   req = dist.isend(tensor=tensor, dst=1)          auto req = dist::isend(world, tensor, 1);
//   group = dist.new_group([0, 1])                  auto group = world.new_group({0, 1}).value();
//   dist.all_reduce(t, op=dist.ReduceOp.SUM,        dist::all_reduce(*group, t, dist::ReduceOp::kSum);
//                   group=group)

#include <cstdint>
#include <ostream>
#include <vector>

#include <ATen/ATen.h>

#include "worker/comm/communicator.h"

namespace cohort::examples::tutorial {

using comm::Communicator;

// Point-to-point communication: rank 0 adds 1 to a zero tensor and sends it to rank 1. Both ranks
// print "Rank R has data 1". Ranks other than 0 and 1 take no part. Needs 2 ranks or more.
void blocking_p2p(Communicator& world, std::ostream& out);
// The same with isend / irecv and req.wait(); also prints "Rank 0 started sending" and "Rank 1
// started receiving" before the wait.
void nonblocking_p2p(Communicator& world, std::ostream& out);

// The tutorial's six collectives over group = new_group([0, 1]) (needs 2 ranks or more; other
// ranks only take part in new_group). Rank r of the group starts from tensor = ones(1) * (r + 1),
// so every result tells the collective apart; each line is "<op>: Rank R has data X":
//   broadcast from 0 → 1 on both; reduce SUM to 0 → 3 at rank 0; all_reduce SUM → 3 on both;
//   scatter from 0 of [10, 11] → 10 + r; gather to 0 → "1 2" at rank 0; all_gather → "1 2".
// The tutorial's own all_reduce (tensor = ones(1)) comes first: "all_reduce(ones): Rank R has
// data 2".
void group_collectives(Communicator& world, std::ostream& out);

// The hand-written ring allreduce of the tutorial: isend to the right, recv from the left, size-1
// times, alternating the send and receive buffers; recv ← the sum of every rank's send.
void ring_allreduce(Communicator& world, const at::Tensor& send, const at::Tensor& recv);
// Runs it on send = ones(3) * (rank + 1) and prints "Rank R has data S" (S = size(size+1)/2).
void ring_allreduce_demo(Communicator& world, std::ostream& out);

// Distributed synchronous SGD: the tutorial's average_gradients (all_reduce SUM, then divide by
// the world size), on every parameter's gradient.
void average_gradients(Communicator& world, const std::vector<at::Tensor>& parameters);

struct SgdOptions {
  int epochs = 5;              // the tutorial's 10, shortened for tests
  int64_t samples = 2048;      // of the synthetic data set (the tutorial's MNIST stands in)
  int64_t global_batch = 128;  // the tutorial's bsz = 128 / world size per rank
  double lr = 0.05;            // the tutorial's SGD(lr=0.01, momentum=0.5), faster for tests
  double momentum = 0.5;
};

struct SgdResult {
  std::vector<double> epoch_loss;      // this rank's mean batch loss per epoch
  std::vector<at::Tensor> parameters;  // the trained model (weight, bias)
};

// The tutorial's run(): partitions a deterministic synthetic classification set (rank r takes
// the r-th equal part), trains a linear softmax model with torch::optim::SGD and
// average_gradients before each step, and prints "Rank R, epoch E: LOSS" per epoch.
// samples must divide by global_batch, and global_batch by the world size.
SgdResult sync_sgd(Communicator& world, std::ostream& out, const SgdOptions& options = {});

// The same training in one process on the whole data set, with each step's batch the union of
// the ranks' batches of that step: what sync_sgd must reproduce on any number of ranks.
SgdResult sync_sgd_reference(int world_size, const SgdOptions& options = {});

}  // namespace cohort::examples::tutorial
