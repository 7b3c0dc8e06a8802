#include "worker/train/multi_node_optimizer.h"

#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "worker/autograd/tensor_comm.h"

namespace cohort::train {

// One parameter's place in a bucket.
struct Slot {
  at::Tensor param;
  size_t bucket = 0;
  at::Tensor view;     // the parameter's span of its bucket, shaped like the parameter
  bool ready = false;  // this step's gradient is in `view` (overlap mode)
  bool has_hook = false;
  unsigned hook = 0;
};

struct Bucket {
  at::Tensor flat;  // the bucket's buffer: gradients in, averages out (also broadcast staging)
  comm::DataType dtype = comm::DataType::kFloat32;
  std::vector<size_t> slots;
  size_t pending = 0;  // slots whose gradient has not arrived this step
  std::shared_ptr<comm::Work> work;
};

struct MultiNodeOptimizer::State {
  comm::Communicator* comm = nullptr;
  MultiNodeOptimizerOptions options;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;

  // Guards the per-step fields below and the buckets' pending/work (hooks vs. step()).
  std::mutex mutex;
  size_t next_launch = 0;  // buckets launch strictly in index order
  int repeated_slot = -1;  // a hook fired twice before step(): reported by step()
  bool needs_broadcast = true;
  double wait_seconds = 0;  // step()'s thread only

  comm::CallOptions call() const { return comm::CallOptions{options.timeout, false}; }

  // Starts every bucket that is complete and whose predecessors have started. Holds `mutex`.
  void launch_ready_locked() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch++];
      b.work = comm->allreduce(b.flat.data_ptr(), b.flat.data_ptr(), static_cast<size_t>(b.flat.numel()),
                               b.dtype, comm::ReduceOp::kAvg, call());
    }
  }

  // Puts slot `s`'s gradient for this step in its bucket (zeros when undefined). Holds `mutex`.
  void fill_locked(size_t s, const at::Tensor& grad) {
    Slot& slot = slots[s];
    at::NoGradGuard no_grad;
    if (grad.defined()) {
      if (grad.is_sparse())
        throw std::runtime_error("MultiNodeOptimizer: sparse gradients are not supported");
      slot.view.copy_(grad);
    } else {
      slot.view.zero_();
    }
    slot.ready = true;
    --buckets[slot.bucket].pending;
  }

  void on_gradient(size_t s, const at::Tensor& grad) {
    std::lock_guard<std::mutex> lock(mutex);
    if (slots[s].ready) {
      repeated_slot = static_cast<int>(s);
      return;
    }
    fill_locked(s, grad);
    launch_ready_locked();
  }

  // Back to "no gradient arrived" for the next step. Holds `mutex`.
  void reset_locked() {
    for (Slot& slot : slots) slot.ready = false;
    for (Bucket& b : buckets) {
      b.pending = b.slots.size();
      b.work.reset();
    }
    next_launch = 0;
    repeated_slot = -1;
  }

  // Launches what is left and waits for every bucket; the buckets then hold the averages.
  void reduce_all() {
    std::vector<std::shared_ptr<comm::Work>> works;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (repeated_slot >= 0) {
        int s = repeated_slot;
        // Wait for what was launched so the buffers are free, then start over next step.
        for (Bucket& b : buckets) {
          if (b.work) b.work->wait().ignore_error();
        }
        reset_locked();
        throw std::runtime_error(fmt::format(
            "MultiNodeOptimizer: the gradient hook of parameter {} fired twice before step() (several "
            "backward "
            "passes per step?); use MultiNodeOptimizerOptions::overlap = false to accumulate gradients",
            s));
      }
      for (size_t s = 0; s < slots.size(); ++s) {
        if (slots[s].ready) continue;
        // overlap: no hook fired, so this parameter took no part in this backward: zeros.
        // Otherwise the gradient is in .grad now (undefined → zeros).
        fill_locked(s, options.overlap ? at::Tensor() : slots[s].param.grad());
      }
      launch_ready_locked();
      for (Bucket& b : buckets) works.push_back(b.work);
    }
    auto wait_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < works.size(); ++i) {
      Status status = works[i]->wait();
      if (!status.ok()) {
        for (size_t j = i + 1; j < works.size(); ++j) works[j]->wait().ignore_error();
        std::lock_guard<std::mutex> lock(mutex);
        reset_locked();
        autograd::throw_if_error(
            status,
            fmt::format("MultiNodeOptimizer: allreduce of gradient bucket {} of {}", i, works.size()));
      }
    }
    wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  }

  // Writes the averages to .grad.
  void unpack_gradients() {
    at::NoGradGuard no_grad;
    for (Slot& slot : slots) {
      if (!slot.param.requires_grad()) continue;
      if (slot.param.grad().defined()) {
        slot.param.mutable_grad().copy_(slot.view);
      } else if (options.zero_fill) {
        slot.param.mutable_grad() =
            slot.view.to(slot.param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
      }
    }
  }

  // Rank 0's parameters to every rank, bucket by bucket (reusing the buffers).
  void broadcast_parameters() {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < buckets.size(); ++i) {
      Bucket& b = buckets[i];
      // Parameters go in their own type: a compressed gradient bucket would round them.
      const at::Tensor& first = slots[b.slots.front()].param;
      bool own_type = b.flat.scalar_type() == first.scalar_type();
      at::Tensor staging =
          own_type ? b.flat : at::empty({b.flat.numel()}, first.options().requires_grad(false));
      std::vector<at::Tensor> views;
      int64_t offset = 0;
      for (size_t s : b.slots) {
        const at::Tensor& p = slots[s].param;
        views.push_back(staging.narrow(0, offset, p.numel()).view(p.sizes()));
        offset += p.numel();
      }
      if (comm->rank() == 0) {
        for (size_t k = 0; k < b.slots.size(); ++k) views[k].copy_(slots[b.slots[k]].param);
      }
      comm::CallOptions blocking = call();
      blocking.blocking = true;
      autograd::wait_or_throw(
          comm->broadcast(staging.data_ptr(), static_cast<size_t>(staging.numel()),
                          autograd::to_data_type(staging.scalar_type()), 0, blocking),
          fmt::format("MultiNodeOptimizer: broadcast of parameter bucket {} of {}", i, buckets.size()));
      if (comm->rank() != 0) {
        for (size_t k = 0; k < b.slots.size(); ++k) slots[b.slots[k]].param.copy_(views[k]);
      }
    }
    needs_broadcast = false;
  }
};

namespace {

// Lays the parameters out in reverse order into buckets (see the header).
void lay_out(MultiNodeOptimizer::State& state, const std::vector<at::Tensor>& params) {
  struct Pending {
    std::vector<size_t> slots;
    int64_t numel = 0;
  };
  const auto& options = state.options;
  std::vector<Pending> plan;
  at::TensorOptions current;
  for (size_t k = params.size(); k-- > 0;) {
    const at::Tensor& p = params[k];
    size_t limit = plan.size() == 1 ? options.first_bucket_bytes : options.bucket_bytes;
    bool same_kind = !plan.empty() && current.dtype() == p.dtype() && current.device() == p.device();
    if (options.grad_dtype && !at::isFloatingType(*options.grad_dtype)) {
      throw std::invalid_argument(fmt::format("MultiNodeOptimizer: grad_dtype {} is not a floating type",
                                              c10::toString(*options.grad_dtype)));
    }
    size_t bytes = static_cast<size_t>(plan.empty() ? 0 : plan.back().numel) * p.element_size();
    if (plan.empty() || !same_kind || (bytes > 0 && bytes + p.numel() * p.element_size() > limit)) {
      plan.emplace_back();
      current = p.options();
    }
    Slot slot;
    slot.param = p;
    slot.bucket = plan.size() - 1;
    state.slots.push_back(slot);
    plan.back().slots.push_back(state.slots.size() - 1);
    plan.back().numel += p.numel();
  }
  for (const Pending& pending : plan) {
    Bucket b;
    const at::Tensor& first = state.slots[pending.slots.front()].param;
    at::ScalarType type = first.scalar_type();
    if (options.grad_dtype && at::isFloatingType(type)) type = *options.grad_dtype;
    b.flat = at::zeros({pending.numel}, first.options().dtype(type).requires_grad(false));
    b.dtype = autograd::to_data_type(type);
    b.slots = pending.slots;
    b.pending = b.slots.size();
    int64_t offset = 0;
    for (size_t s : b.slots) {
      Slot& slot = state.slots[s];
      slot.view = b.flat.narrow(0, offset, slot.param.numel()).view(slot.param.sizes());
      offset += slot.param.numel();
    }
    state.buckets.push_back(std::move(b));
  }
}

}  // namespace

MultiNodeOptimizer::MultiNodeOptimizer(torch::optim::Optimizer& optimizer, comm::Communicator& comm,
                                       MultiNodeOptimizerOptions options)
    : optimizer_(optimizer), comm_(comm), state_(std::make_shared<State>()) {
  state_->comm = &comm;
  state_->options = options;
  std::vector<at::Tensor> params;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) params.push_back(p);
  }
  lay_out(*state_, params);
  if (!options.overlap) return;
  std::weak_ptr<State> weak = state_;
  for (size_t s = 0; s < state_->slots.size(); ++s) {
    Slot& slot = state_->slots[s];
    if (!slot.param.requires_grad()) continue;
    slot.hook = slot.param.register_hook([weak, s](const at::Tensor& grad) {
      if (auto state = weak.lock()) state->on_gradient(s, grad);
    });
    slot.has_hook = true;
  }
}

MultiNodeOptimizer::~MultiNodeOptimizer() {
  for (Slot& slot : state_->slots) {
    if (slot.has_hook) slot.param.remove_hook(slot.hook);
  }
  // Launched allreduces write into the buckets: let them finish before the buffers go.
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (Bucket& b : state_->buckets) {
    if (b.work) b.work->wait().ignore_error();
  }
}

void MultiNodeOptimizer::step() {
  state_->reduce_all();
  state_->unpack_gradients();
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->reset_locked();
  }
  if (state_->needs_broadcast) state_->broadcast_parameters();
  optimizer_.step();
}

void MultiNodeOptimizer::broadcast_parameters() { state_->broadcast_parameters(); }

void MultiNodeOptimizer::zero_grad() { optimizer_.zero_grad(); }

std::vector<size_t> MultiNodeOptimizer::bucket_sizes() const {
  std::vector<size_t> out;
  for (const Bucket& b : state_->buckets) out.push_back(static_cast<size_t>(b.flat.numel()));
  return out;
}

size_t MultiNodeOptimizer::launched_buckets() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->next_launch;
}

double MultiNodeOptimizer::communication_wait_seconds() const { return state_->wait_seconds; }

std::unique_ptr<MultiNodeOptimizer> create_multi_node_optimizer(torch::optim::Optimizer& optimizer,
                                                                comm::Communicator& comm,
                                                                MultiNodeOptimizerOptions options) {
  return std::make_unique<MultiNodeOptimizer>(optimizer, comm, options);
}

}  // namespace cohort::train
