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

// One parameter's place in a bucket (of each buffer set).
struct Slot {
  at::Tensor param;
  size_t bucket = 0;
  // The parameter's span of its bucket in buffer set 0 and (double buffering) 1, shaped like it.
  at::Tensor view[2];
  // The gradient put in view[set] was a real one, not zeros for a parameter without gradient
  // (zero_fill decides from it when the average is unpacked).
  bool had_grad[2] = {false, false};
  bool ready = false;  // this step's gradient is in the filling set's view (overlap mode)
  bool has_hook = false;
  unsigned hook = 0;
};

struct Bucket {
  at::Tensor flat;  // the bucket's buffer: gradients in, averages out (also broadcast staging)
  comm::DataType dtype = comm::DataType::kFloat32;
  std::vector<size_t> slots;
  size_t pending = 0;  // slots whose gradient has not arrived this step
  std::shared_ptr<comm::Work> work;
  at::Tensor hook_result;  // with a comm hook: the average once `work` completed (may be `flat`)
};

struct MultiNodeOptimizer::State {
  comm::Communicator* comm = nullptr;
  MultiNodeOptimizerOptions options;
  std::vector<Slot> slots;
  // Buffer sets: one without double buffering; with it, two that alternate, one filled by this
  // step's gradients while the other's allreduces (the previous step's) complete.
  std::vector<std::vector<Bucket>> sets;

  // Guards the per-step fields below and the buckets' pending/work (hooks vs. step()).
  std::mutex mutex;
  size_t fill = 0;         // the set this step's gradients go to
  size_t next_launch = 0;  // the filling set's buckets launch strictly in index order
  int repeated_slot = -1;  // a hook fired twice before step(): reported by step()
  bool needs_broadcast = true;
  double wait_seconds = 0;  // step()'s thread only

  std::vector<Bucket>& filling() { return sets[fill]; }
  comm::CallOptions call() const { return comm::CallOptions{options.timeout, false}; }

  // Starts every bucket of the filling set that is complete and whose predecessors have started.
  // Holds `mutex`.
  void launch_ready_locked() {
    std::vector<Bucket>& buckets = filling();
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch++];
      // f16 / bf16 gradients are divided by the world size before a SUM (as fp16_compress_hook):
      // kAvg sums first, and partial sums of f16 overflow to inf past 65504 (4 ranks' 20000s)
      // although the average is representable. Before the sync: the division runs on torch's
      // stream.
      const bool divide_first =
          !options.comm_hook && (b.dtype == comm::DataType::kFloat16 || b.dtype == comm::DataType::kBFloat16);
      if (divide_first) b.flat.div_(comm->size());
      // The gradients were copied in on torch's streams (CUDA); see sync_before_comm.
      autograd::sync_before_comm(b.flat);
      if (options.comm_hook) {
        launch_hook_locked(next_launch - 1);
        continue;
      }
      b.work = comm->allreduce(b.flat.data_ptr(), b.flat.data_ptr(), static_cast<size_t>(b.flat.numel()),
                               b.dtype, divide_first ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg, call());
    }
  }

  // Hands bucket `i` of the filling set to options.comm_hook. Holds `mutex`.
  void launch_hook_locked(size_t i) {
    Bucket& b = filling()[i];
    GradBucket bucket;
    bucket.index = i;
    bucket.buffer = b.flat;
    for (size_t s : b.slots) bucket.parameters.push_back(slots[s].param);
    bucket.is_last = i + 1 == filling().size();
    bucket.timeout = options.timeout;
    BucketFuture future = options.comm_hook(*comm, bucket);
    if (!future.work || !future.result.defined() || future.result.numel() != b.flat.numel()) {
      throw std::runtime_error(fmt::format(
          "MultiNodeOptimizer: the comm hook returned no work or a result of another size for bucket {} ({} "
          "elements)",
          i, b.flat.numel()));
    }
    b.work = distributed::as_comm_work(future.work);
    b.hook_result = future.result;
  }

  // Puts slot `s`'s gradient for this step in its bucket of the filling set (zeros when
  // undefined). Holds `mutex`.
  void fill_locked(size_t s, const at::Tensor& grad) {
    Slot& slot = slots[s];
    at::NoGradGuard no_grad;
    if (grad.defined()) {
      if (grad.is_sparse())
        throw std::runtime_error("MultiNodeOptimizer: sparse gradients are not supported");
      slot.view[fill].copy_(grad);
    } else {
      slot.view[fill].zero_();
    }
    slot.had_grad[fill] = grad.defined();
    slot.ready = true;
    --filling()[slot.bucket].pending;
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

  // Makes `set` the filling set with no gradient arrived, for the next step. Its works must be
  // complete (or abandoned). Holds `mutex`.
  void reset_locked(size_t set) {
    fill = set;
    for (Slot& slot : slots) slot.ready = false;
    for (Bucket& b : sets[set]) {
      b.pending = b.slots.size();
      b.work.reset();
    }
    next_launch = 0;
    repeated_slot = -1;
  }

  // Waits for whatever `set` has in flight, ignoring errors (the buffers must be free before
  // they are reused or freed).
  void drain(size_t set) {
    for (Bucket& b : sets[set]) {
      if (b.work) b.work->wait().ignore_error();
      b.work.reset();
    }
  }

  // Completes the filling set with the gradients that did not arrive through hooks and launches
  // every bucket not yet launched. Does not wait.
  void launch_rest() {
    std::lock_guard<std::mutex> lock(mutex);
    if (repeated_slot >= 0) {
      int s = repeated_slot;
      // Wait for what was launched so the buffers are free, then start over next step.
      drain(fill);
      reset_locked(fill);
      throw std::runtime_error(fmt::format(
          "MultiNodeOptimizer: the gradient hook of parameter {} fired twice before step() (several "
          "backward passes per step?); use MultiNodeOptimizerOptions::overlap = false to accumulate "
          "gradients",
          s));
    }
    for (size_t s = 0; s < slots.size(); ++s) {
      if (slots[s].ready) continue;
      // overlap: no hook fired, so this parameter took no part in this backward: zeros.
      // Otherwise the gradient is in .grad now (undefined → zeros).
      fill_locked(s, options.overlap ? at::Tensor() : slots[s].param.grad());
    }
    launch_ready_locked();
  }

  // True when `set` has launched allreduces that nobody has awaited yet.
  bool in_flight(size_t set) const {
    for (const Bucket& b : sets[set]) {
      if (b.work) return true;
    }
    return false;
  }

  // Waits for every bucket of `set`; they then hold the averages. On an error waits for
  // everything in flight (both sets), starts the filling set over and throws: with double
  // buffering the next step then applies nothing, like the first.
  void wait_set(size_t set) {
    std::vector<Bucket>& buckets = sets[set];
    auto wait_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < buckets.size(); ++i) {
      Status status = buckets[i].work->wait();
      if (!status.ok()) {
        for (size_t k = 0; k < sets.size(); ++k) drain(k);
        std::lock_guard<std::mutex> lock(mutex);
        reset_locked(fill);
        autograd::throw_if_error(
            status,
            fmt::format("MultiNodeOptimizer: allreduce of gradient bucket {} of {}", i, buckets.size()));
      }
    }
    wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
    for (Bucket& b : buckets) {
      if (b.hook_result.defined() && !b.hook_result.is_same(b.flat)) {
        at::NoGradGuard no_grad;
        b.flat.copy_(b.hook_result);
      }
      b.hook_result = at::Tensor();
    }
  }

  // Writes the averages held by `set` to .grad.
  void unpack_gradients(size_t set) {
    at::NoGradGuard no_grad;
    for (Slot& slot : slots) {
      if (!slot.param.requires_grad()) continue;
      const at::Tensor& average = slot.view[set];
      // With double buffering .grad is this step's local gradient, not the one averaged in `set`:
      // whether the parameter had one then is what counts.
      bool had_grad = options.double_buffering ? slot.had_grad[set] : slot.param.grad().defined();
      if (!had_grad && !options.zero_fill) {
        if (slot.param.grad().defined()) slot.param.mutable_grad() = at::Tensor();
        continue;
      }
      if (slot.param.grad().defined()) {
        slot.param.mutable_grad().copy_(average);
      } else {
        slot.param.mutable_grad() =
            average.to(slot.param.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
      }
    }
  }

  // Rank 0's parameters to every rank, bucket by bucket, staged in `set`'s buffers (which must
  // have nothing in flight).
  void broadcast_parameters(size_t set) {
    at::NoGradGuard no_grad;
    std::vector<Bucket>& buckets = sets[set];
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
      autograd::sync_before_comm(staging);
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

  // Without double buffering: this step's averages, applied now.
  void step_synchronous(torch::optim::Optimizer& optimizer) {
    launch_rest();
    wait_set(fill);
    unpack_gradients(fill);
    {
      std::lock_guard<std::mutex> lock(mutex);
      reset_locked(fill);
    }
    if (needs_broadcast) broadcast_parameters(fill);
    optimizer.step();
  }

  // Double buffering: launch this step's set, apply the other one (the previous step's).
  void step_double_buffered(torch::optim::Optimizer& optimizer) {
    launch_rest();
    size_t previous = 1 - fill;
    bool apply = in_flight(previous);  // false only at the first step (or after an error)
    if (apply) wait_set(previous);
    {
      // The next step fills the set just awaited; this step's stays in flight until then.
      std::lock_guard<std::mutex> lock(mutex);
      reset_locked(previous);
    }
    if (apply) unpack_gradients(fill);
    // Issued after this step's allreduces on every rank, so the collective order matches; staged
    // in the set just unpacked (the other one's buffers are being reduced).
    if (needs_broadcast) broadcast_parameters(fill);
    if (apply) optimizer.step();
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
  if (options.grad_dtype && !at::isFloatingType(*options.grad_dtype)) {
    throw std::invalid_argument(fmt::format("MultiNodeOptimizer: grad_dtype {} is not a floating type",
                                            c10::toString(*options.grad_dtype)));
  }
  std::vector<Pending> plan;
  at::TensorOptions current;
  bool closed = true;  // the last bucket takes no more parameters
  for (size_t k = params.size(); k-- > 0;) {
    const at::Tensor& p = params[k];
    bool same_kind = !plan.empty() && current.dtype() == p.dtype() && current.device() == p.device();
    if (closed || !same_kind) {
      plan.emplace_back();
      current = p.options();
    }
    Slot slot;
    slot.param = p;
    slot.bucket = plan.size() - 1;
    state.slots.push_back(slot);
    plan.back().slots.push_back(state.slots.size() - 1);
    plan.back().numel += p.numel();
    // Closed once it reaches its limit (DDP's rule): a parameter bigger than the limit goes out
    // with the ones before it, as soon as its own gradient arrives.
    size_t limit = plan.size() == 1 ? options.first_bucket_bytes : options.bucket_bytes;
    closed = static_cast<size_t>(plan.back().numel) * p.element_size() >= limit;
  }
  state.sets.resize(options.double_buffering ? 2 : 1);
  for (size_t set = 0; set < state.sets.size(); ++set) {
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
        slot.view[set] = b.flat.narrow(0, offset, slot.param.numel()).view(slot.param.sizes());
        offset += slot.param.numel();
      }
      state.sets[set].push_back(std::move(b));
    }
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
  // Launched allreduces write into the buckets: let them finish before the buffers go. With
  // double buffering the last step's averages are dropped here.
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (size_t set = 0; set < state_->sets.size(); ++set) state_->drain(set);
}

void MultiNodeOptimizer::step() {
  if (state_->options.double_buffering) {
    state_->step_double_buffered(optimizer_);
  } else {
    state_->step_synchronous(optimizer_);
  }
}

// Between steps the filling set has nothing in flight (with double buffering the previous
// step's set does), so its buffers can stage the broadcast.
void MultiNodeOptimizer::broadcast_parameters() { state_->broadcast_parameters(state_->fill); }

void MultiNodeOptimizer::zero_grad() { optimizer_.zero_grad(); }

std::vector<size_t> MultiNodeOptimizer::bucket_sizes() const {
  std::vector<size_t> out;
  for (const Bucket& b : state_->sets[0]) out.push_back(static_cast<size_t>(b.flat.numel()));
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
