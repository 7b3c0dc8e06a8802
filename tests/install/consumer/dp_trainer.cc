// A data-parallel trainer built outside Bazel against the installed cohort library (issue 12):
// the program a user writes. Each rank fits y = 3x - 1 on its own samples; the multi-node
// optimizer averages gradients, so every rank must end with the same parameters.
//
//   dp_trainer 'file:///tmp/store?rank=0&world_size=2'   # one rank; run one per rank
//
// Prints "rank R loss FIRST -> LAST params CHECKSUM"; exits 1 if the loss did not fall or the
// ranks' parameters differ.
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>

#include "worker/comm/bootstrap.h"
#include "worker/train/multi_node_optimizer.h"

int main(int argc, char** argv) {
  if (argc != 2) { std::fprintf(stderr, "usage: dp_trainer INIT_URL\n"); return 2; }
  namespace comm = cohort::comm;
  auto c = comm::create_communicator("flat", comm::InitOptions::from_url(argv[1]));
  if (!c.ok()) { std::fprintf(stderr, "%s\n", c.status().to_string().c_str()); return 1; }
  comm::Communicator& world = **c;
  torch::manual_seed(100 + world.rank());  // ranks start apart: the first step's broadcast aligns them
  torch::nn::Linear model(1, 1);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  auto optimizer = cohort::train::create_multi_node_optimizer(sgd, world);
  at::Tensor x = torch::rand({64, 1}) * 2 - 1, y = 3 * x - 1;  // this rank's shard
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    optimizer->zero_grad();
    at::Tensor loss = (model->forward(x) - y).pow(2).mean();
    loss.backward();
    optimizer->step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  double checksum = 0;
  for (const auto& p : model->parameters()) checksum += p.sum().item<double>();
  auto lo = world.allreduce_obj(checksum, comm::ReduceOp::kMin);
  auto hi = world.allreduce_obj(checksum, comm::ReduceOp::kMax);
  if (!lo.ok() || !hi.ok()) { std::fprintf(stderr, "checksum allreduce failed\n"); return 1; }
  std::printf("rank %d loss %.4f -> %.6f params %.6f\n", world.rank(), first, last, checksum);
  if (!(last < first / 10)) { std::fprintf(stderr, "rank %d: loss did not fall\n", world.rank()); return 1; }
  if (*hi - *lo > 1e-6) { std::fprintf(stderr, "ranks' parameters differ: %g vs %g\n", *lo, *hi); return 1; }
  return 0;
}
