#include "worker/examples/tutorial/tutorial_programs.h"

#include <memory>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/sgd.h>

#include "worker/distributed/process_group.h"

namespace cohort::examples::tutorial {

namespace dist = cohort::distributed;

namespace {

void print_data(std::ostream& out, const std::string& prefix, int rank, const at::Tensor& tensor) {
  std::vector<double> values;
  at::Tensor flat = tensor.to(at::kDouble).contiguous();
  for (int64_t i = 0; i < flat.numel(); ++i) values.push_back(flat.data_ptr<double>()[i]);
  out << fmt::format("{}Rank {} has data {:g}\n", prefix, rank, fmt::join(values, " "));
}

void require_ranks(const Communicator& world, int n, const char* program) {
  if (world.size() < n) {
    throw std::runtime_error(fmt::format("{} needs {} ranks or more, got {}", program, n, world.size()));
  }
}

}  // namespace

void blocking_p2p(Communicator& world, std::ostream& out) {
  require_ranks(world, 2, "blocking_p2p");
  const int rank = world.rank();
  if (rank > 1) return;
  at::Tensor tensor = at::zeros({1});
  if (rank == 0) {
    tensor += 1;
    dist::send(world, tensor, /*dst=*/1);  // Send the tensor to process 1
  } else {
    dist::recv(world, tensor, /*src=*/0);  // Receive tensor from process 0
  }
  print_data(out, "", rank, tensor[0]);
}

void nonblocking_p2p(Communicator& world, std::ostream& out) {
  require_ranks(world, 2, "nonblocking_p2p");
  const int rank = world.rank();
  if (rank > 1) return;
  at::Tensor tensor = at::zeros({1});
  std::shared_ptr<dist::Work> req;
  if (rank == 0) {
    tensor += 1;
    req = dist::isend(world, tensor, /*dst=*/1);
    out << "Rank 0 started sending\n";
  } else {
    req = dist::irecv(world, tensor, /*src=*/0);
    out << "Rank 1 started receiving\n";
  }
  req->wait();
  print_data(out, "", rank, tensor[0]);
}

void group_collectives(Communicator& world, std::ostream& out) {
  require_ranks(world, 2, "group_collectives");
  auto made = world.new_group({0, 1});  // collective over the world; null off the group
  if (!made.ok()) throw std::runtime_error("new_group([0, 1]): " + made.status().to_string());
  std::unique_ptr<Communicator> group = std::move(made).value();
  if (group == nullptr) return;
  const int rank = world.rank();

  // The tutorial's all_reduce example, verbatim.
  at::Tensor tensor = at::ones({1});
  dist::all_reduce(*group, tensor, dist::ReduceOp::kSum);
  print_data(out, "all_reduce(ones): ", rank, tensor[0]);

  auto start = [&] { return at::ones({1}) * (group->rank() + 1); };
  at::Tensor t = start();
  dist::broadcast(*group, t, /*src=*/0);
  print_data(out, "broadcast: ", rank, t);

  t = start();
  dist::reduce(*group, t, /*dst=*/0, dist::ReduceOp::kSum);
  if (group->rank() == 0) print_data(out, "reduce: ", rank, t);

  t = start();
  dist::all_reduce(*group, t, dist::ReduceOp::kSum);
  print_data(out, "all_reduce: ", rank, t);

  t = at::zeros({1});
  std::vector<at::Tensor> scatter_list;
  if (group->rank() == 0) scatter_list = {at::full({1}, 10.0), at::full({1}, 11.0)};
  dist::scatter(*group, t, scatter_list, /*src=*/0);
  print_data(out, "scatter: ", rank, t);

  std::vector<at::Tensor> gather_list;
  if (group->rank() == 0) gather_list = {at::zeros({1}), at::zeros({1})};
  dist::gather(*group, start(), gather_list, /*dst=*/0);
  if (group->rank() == 0) print_data(out, "gather: ", rank, at::cat(gather_list));

  std::vector<at::Tensor> all = {at::zeros({1}), at::zeros({1})};
  dist::all_gather(*group, all, start());
  print_data(out, "all_gather: ", rank, at::cat(all));
}

void ring_allreduce(Communicator& world, const at::Tensor& send, const at::Tensor& recv) {
  const int rank = world.rank(), size = world.size();
  at::Tensor send_buff = send.clone();
  at::Tensor recv_buff = send.clone();
  at::Tensor accum = send.clone();
  const int left = ((rank - 1) + size) % size;
  const int right = (rank + 1) % size;
  for (int i = 0; i < size - 1; ++i) {
    std::shared_ptr<dist::Work> send_req;
    if (i % 2 == 0) {
      // Send send_buff
      send_req = dist::isend(world, send_buff, right);
      dist::recv(world, recv_buff, left);
      accum.add_(recv_buff);
    } else {
      // Send recv_buff
      send_req = dist::isend(world, recv_buff, right);
      dist::recv(world, send_buff, left);
      accum.add_(send_buff);
    }
    send_req->wait();
  }
  recv.copy_(accum);
}

void ring_allreduce_demo(Communicator& world, std::ostream& out) {
  at::Tensor send = at::ones({3}) * (world.rank() + 1);
  at::Tensor recv = at::zeros({3});
  ring_allreduce(world, send, recv);
  print_data(out, "", world.rank(), recv);
}

void average_gradients(Communicator& world, const std::vector<at::Tensor>& parameters) {
  const double size = world.size();
  for (const at::Tensor& param : parameters) {
    dist::all_reduce(world, param.mutable_grad(), dist::ReduceOp::kSum);
    param.mutable_grad().div_(size);
  }
}

namespace {

constexpr int64_t kFeatures = 8;
constexpr int64_t kClasses = 3;

// Sample i: features sin(i * (f + 1) * 0.37 + f); its class is the argmax of a fixed linear map,
// so a linear model can learn it. No random generator: every rank (thread or process) builds the
// same set.
void synthetic(int64_t samples, at::Tensor* x, at::Tensor* y) {
  at::Tensor i = at::arange(samples, at::kDouble).unsqueeze(1);
  at::Tensor f = at::arange(kFeatures, at::kDouble).unsqueeze(0);
  *x = at::sin(i * (f + 1) * 0.37 + f).to(at::kFloat);
  at::Tensor teacher = at::cos(at::arange(kFeatures * kClasses, at::kFloat)).reshape({kFeatures, kClasses});
  *y = x->mm(teacher).argmax(1);
}

struct Model {
  at::Tensor weight = at::cos(at::arange(kFeatures * kClasses, at::kFloat) * 1.3)
                          .mul(0.1)
                          .reshape({kFeatures, kClasses})
                          .set_requires_grad(true);
  at::Tensor bias = at::zeros({kClasses}, at::kFloat).set_requires_grad(true);
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y) const {
    return at::cross_entropy_loss(x.mm(weight) + bias, y);
  }
};

void check_options(const SgdOptions& o, int world_size) {
  if (o.samples % o.global_batch != 0 || o.global_batch % world_size != 0) {
    throw std::runtime_error(
        fmt::format("sync_sgd: samples ({}) must divide by global_batch ({}), and it by the "
                    "world size ({})",
                    o.samples, o.global_batch, world_size));
  }
}

// Rank r's batch k: rows of its partition [r * part, (r + 1) * part).
at::Tensor batch_rows(int rank, int world_size, int64_t k, const SgdOptions& o) {
  const int64_t part = o.samples / world_size, bsz = o.global_batch / world_size;
  return at::arange(rank * part + k * bsz, rank * part + (k + 1) * bsz, at::kLong);
}

}  // namespace

SgdResult sync_sgd(Communicator& world, std::ostream& out, const SgdOptions& options) {
  const int rank = world.rank(), size = world.size();
  check_options(options, size);
  at::Tensor x, y;
  synthetic(options.samples, &x, &y);
  Model model;
  std::vector<at::Tensor> params = {model.weight, model.bias};
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(options.lr).momentum(options.momentum));
  const int64_t num_batches = options.samples / options.global_batch;
  SgdResult result;
  for (int epoch = 0; epoch < options.epochs; ++epoch) {
    double epoch_loss = 0.0;
    for (int64_t k = 0; k < num_batches; ++k) {
      at::Tensor rows = batch_rows(rank, size, k, options);
      optimizer.zero_grad();
      at::Tensor loss = model.loss(x.index_select(0, rows), y.index_select(0, rows));
      epoch_loss += loss.item<double>();
      loss.backward();
      average_gradients(world, params);
      optimizer.step();
    }
    out << fmt::format("Rank {}, epoch {}: {:.6f}\n", rank, epoch, epoch_loss / num_batches);
    result.epoch_loss.push_back(epoch_loss / num_batches);
  }
  result.parameters = {model.weight.detach().clone(), model.bias.detach().clone()};
  return result;
}

SgdResult sync_sgd_reference(int world_size, const SgdOptions& options) {
  check_options(options, world_size);
  at::Tensor x, y;
  synthetic(options.samples, &x, &y);
  Model model;
  std::vector<at::Tensor> params = {model.weight, model.bias};
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(options.lr).momentum(options.momentum));
  const int64_t num_batches = options.samples / options.global_batch;
  SgdResult result;
  for (int epoch = 0; epoch < options.epochs; ++epoch) {
    for (int64_t k = 0; k < num_batches; ++k) {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < world_size; ++r) parts.push_back(batch_rows(r, world_size, k, options));
      at::Tensor rows = at::cat(parts);
      optimizer.zero_grad();
      // The mean over equal per-rank batches of their mean losses is the mean over the union.
      model.loss(x.index_select(0, rows), y.index_select(0, rows)).backward();
      optimizer.step();
    }
  }
  result.parameters = {model.weight.detach().clone(), model.bias.detach().clone()};
  return result;
}

}  // namespace cohort::examples::tutorial
