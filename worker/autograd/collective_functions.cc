#include "worker/autograd/collective_functions.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/autograd/tensor_comm.h"

namespace cohort::autograd {
namespace {

using comm::Communicator;
using comm::ReduceOp;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Custom functions must return one entry per forward argument; the trailing non-tensor
// arguments (communicator, root, ...) get undefined gradients, and extra undefined entries are
// dropped by libtorch.
variable_list grads(std::initializer_list<at::Tensor> list) {
  variable_list out(list);
  out.resize(out.size() + 8);
  return out;
}

size_t count_of(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }

void check_root(const Communicator& comm, int root, const char* op) {
  if (root < 0 || root >= comm.size()) {
    throw std::runtime_error(
        fmt::format("cohort autograd: {}: root {} is outside {}", op, root, comm.description()));
  }
}

// xs must be [size, ...]: one block per rank.
void check_blocks(const Communicator& comm, const at::Tensor& xs, const char* op) {
  if (xs.dim() == 0 || xs.size(0) != comm.size()) {
    throw std::runtime_error(
        fmt::format("cohort autograd: {}: expected a tensor of shape [{}, ...] (one block per "
                    "rank), got {}",
                    op, comm.size(), c10::str(xs.sizes())));
  }
}

std::vector<int64_t> with_leading(int64_t n, at::IntArrayRef shape) {
  std::vector<int64_t> out{n};
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

// ---- allreduce ----

at::Tensor run_allreduce(Communicator& comm, const at::Tensor& x, ReduceOp op) {
  at::Tensor y = at::empty_like(x);
  sync_before_comm(x);
  wait_or_throw(comm.allreduce(x.data_ptr(), y.data_ptr(), count_of(x), to_data_type(x.scalar_type()), op),
                fmt::format("allreduce ({}) of {} elements", comm::reduce_op_name(op), x.numel()));
  return y;
}

struct AllreduceFunction : torch::autograd::Function<AllreduceFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm, int64_t op) {
    save_communicator(ctx, comm);
    ctx->saved_data["op"] = op;
    at::Tensor xc = contiguous_for_comm(x, "allreduce");
    at::Tensor y = run_allreduce(*comm, xc, static_cast<ReduceOp>(op));
    ctx->save_for_backward({xc, y});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    Communicator& comm = load_communicator(ctx);
    auto op = static_cast<ReduceOp>(ctx->saved_data["op"].toInt());
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& y = saved[1];
    at::Tensor grad = contiguous_for_comm(grad_outputs[0], "allreduce backward");
    switch (op) {
      case ReduceOp::kSum:
        return grads({run_allreduce(comm, grad, ReduceOp::kSum)});
      case ReduceOp::kAvg:
        return grads({run_allreduce(comm, grad, ReduceOp::kSum).div_(comm.size())});
      case ReduceOp::kMax:
      case ReduceOp::kMin: {
        // One allreduce carries both the summed gradient and the number of ranks holding the
        // extreme at each element (ties split the gradient evenly).
        at::Tensor mask = x.eq(y).to(grad.scalar_type());
        at::Tensor both = run_allreduce(comm, at::stack({grad, mask}).contiguous(), ReduceOp::kSum);
        return grads({both[0].mul(mask).div(both[1].clamp_min(1))});
      }
      case ReduceOp::kProduct: {
        // d(prod_r x_r)/dx_me = prod_{r != me} x_r, computed from everyone's values without
        // dividing, so zeros in x are handled. One allgather carries values and gradients.
        at::Tensor both = at::stack({x, grad}).contiguous();
        at::Tensor all = at::empty(with_leading(comm.size(), both.sizes()), both.options());
        sync_before_comm(both);
        wait_or_throw(
            comm.allgather(both.data_ptr(), all.data_ptr(), count_of(both), to_data_type(both.scalar_type())),
            "allreduce (prod) backward: allgather");
        at::Tensor grad_sum = all.select(1, 1).sum(0);
        at::Tensor others = at::ones_like(x);
        for (int r = 0; r < comm.size(); ++r) {
          if (r != comm.rank()) others.mul_(all[r][0]);
        }
        return grads({grad_sum.mul(others)});
      }
    }
    throw std::runtime_error("cohort autograd: allreduce backward: unknown reduce op");
  }
};

// ---- bcast ----

struct BcastFunction : torch::autograd::Function<BcastFunction> {
  // `input` is x at root and an anchor (or an undefined tensor) elsewhere; off root the result
  // goes on `device`.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, Communicator* comm, int64_t root,
                            std::vector<int64_t> shape, at::ScalarType type, at::Device device) {
    save_communicator(ctx, comm);
    ctx->saved_data["root"] = root;
    bool is_root = comm->rank() == root;
    at::Tensor y = is_root ? contiguous_for_comm(input, "bcast").clone()
                           : at::empty(shape, at::TensorOptions(type).device(device));
    sync_before_comm(y);
    wait_or_throw(comm->broadcast(y.data_ptr(), count_of(y), to_data_type(type), static_cast<int>(root)),
                  fmt::format("bcast from root {}", root));
    if (input.defined()) ctx->save_for_backward({input});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    Communicator& comm = load_communicator(ctx);
    int root = static_cast<int>(ctx->saved_data["root"].toInt());
    at::Tensor grad = contiguous_for_comm(grad_outputs[0], "bcast backward");
    at::Tensor sum = at::empty_like(grad);
    sync_before_comm(grad);
    wait_or_throw(comm.reduce(grad.data_ptr(), sum.data_ptr(), count_of(grad),
                              to_data_type(grad.scalar_type()), ReduceOp::kSum, root),
                  "bcast backward: reduce to root");
    if (comm.rank() == root) return grads({sum});
    auto saved = ctx->get_saved_variables();
    return grads({saved.empty() ? at::Tensor() : at::zeros_like(saved[0])});
  }
};

// ---- reduce ----

struct ReduceFunction : torch::autograd::Function<ReduceFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm, int64_t root) {
    save_communicator(ctx, comm);
    ctx->saved_data["root"] = root;
    at::Tensor xc = contiguous_for_comm(x, "reduce");
    at::Tensor y = at::empty_like(xc);
    sync_before_comm(xc);
    wait_or_throw(comm->reduce(xc.data_ptr(), y.data_ptr(), count_of(xc), to_data_type(xc.scalar_type()),
                               ReduceOp::kSum, static_cast<int>(root)),
                  fmt::format("reduce to root {}", root));
    ctx->save_for_backward({xc});
    if (comm->rank() == root) return y;
    return at::zeros({}, xc.options());  // the delegate
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    Communicator& comm = load_communicator(ctx);
    int root = static_cast<int>(ctx->saved_data["root"].toInt());
    at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor grad = comm.rank() == root ? contiguous_for_comm(grad_outputs[0], "reduce backward").clone()
                                          : at::empty_like(x);
    sync_before_comm(grad);
    wait_or_throw(comm.broadcast(grad.data_ptr(), count_of(grad), to_data_type(grad.scalar_type()), root),
                  "reduce backward: bcast from root");
    return grads({grad});
  }
};

// ---- gather / scatter ----

struct GatherFunction : torch::autograd::Function<GatherFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm, int64_t root) {
    save_communicator(ctx, comm);
    ctx->saved_data["root"] = root;
    at::Tensor xc = contiguous_for_comm(x, "gather");
    bool is_root = comm->rank() == root;
    at::Tensor y = is_root ? at::empty(with_leading(comm->size(), xc.sizes()), xc.options()) : at::Tensor();
    sync_before_comm(xc);
    wait_or_throw(comm->gather(xc.data_ptr(), is_root ? y.data_ptr() : nullptr, count_of(xc),
                               to_data_type(xc.scalar_type()), static_cast<int>(root)),
                  fmt::format("gather to root {}", root));
    ctx->save_for_backward({xc});
    return is_root ? y : at::zeros({}, xc.options());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    Communicator& comm = load_communicator(ctx);
    int root = static_cast<int>(ctx->saved_data["root"].toInt());
    at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor grad =
        comm.rank() == root ? contiguous_for_comm(grad_outputs[0], "gather backward") : at::Tensor();
    at::Tensor out = at::empty_like(x);
    sync_before_comm(out);
    wait_or_throw(comm.scatter(grad.defined() ? grad.data_ptr() : nullptr, out.data_ptr(), count_of(out),
                               to_data_type(out.scalar_type()), root),
                  "gather backward: scatter from root");
    return grads({out});
  }
};

struct ScatterFunction : torch::autograd::Function<ScatterFunction> {
  // `input` is xs at root and an anchor (or undefined) elsewhere; `shape` is xs's; the result goes
  // on `device` (xs's at root).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, Communicator* comm, int64_t root,
                            std::vector<int64_t> shape, at::ScalarType type, at::Device device) {
    save_communicator(ctx, comm);
    ctx->saved_data["root"] = root;
    ctx->saved_data["shape"] = shape;
    bool is_root = comm->rank() == root;
    at::Tensor xs = is_root ? contiguous_for_comm(input, "scatter") : at::Tensor();
    at::Tensor y = at::empty(at::IntArrayRef(shape).slice(1), at::TensorOptions(type).device(device));
    sync_before_comm(is_root ? xs : y);
    wait_or_throw(comm->scatter(is_root ? xs.data_ptr() : nullptr, y.data_ptr(), count_of(y),
                                to_data_type(type), static_cast<int>(root)),
                  fmt::format("scatter from root {}", root));
    if (input.defined()) ctx->save_for_backward({input});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    Communicator& comm = load_communicator(ctx);
    int root = static_cast<int>(ctx->saved_data["root"].toInt());
    bool is_root = comm.rank() == root;
    at::Tensor grad = contiguous_for_comm(grad_outputs[0], "scatter backward");
    at::Tensor all =
        is_root ? at::empty(ctx->saved_data["shape"].toIntVector(), grad.options()) : at::Tensor();
    sync_before_comm(grad);
    wait_or_throw(comm.gather(grad.data_ptr(), is_root ? all.data_ptr() : nullptr, count_of(grad),
                              to_data_type(grad.scalar_type()), root),
                  "scatter backward: gather to root");
    if (is_root) return grads({all});
    auto saved = ctx->get_saved_variables();
    return grads({saved.empty() ? at::Tensor() : at::zeros_like(saved[0])});
  }
};

// ---- allgather / reduce_scatter / alltoall ----

at::Tensor run_allgather(Communicator& comm, const at::Tensor& x, const char* what) {
  at::Tensor y = at::empty(with_leading(comm.size(), x.sizes()), x.options());
  sync_before_comm(x);
  wait_or_throw(comm.allgather(x.data_ptr(), y.data_ptr(), count_of(x), to_data_type(x.scalar_type())), what);
  return y;
}

at::Tensor run_reduce_scatter(Communicator& comm, const at::Tensor& xs, const char* what) {
  at::Tensor y = at::empty(xs.sizes().slice(1), xs.options());
  sync_before_comm(xs);
  wait_or_throw(comm.reduce_scatter(xs.data_ptr(), y.data_ptr(), count_of(y), to_data_type(xs.scalar_type()),
                                    ReduceOp::kSum),
                what);
  return y;
}

at::Tensor run_alltoall(Communicator& comm, const at::Tensor& xs, const char* what) {
  at::Tensor y = at::empty_like(xs);
  sync_before_comm(xs);
  wait_or_throw(
      comm.alltoall(xs.data_ptr(), y.data_ptr(), count_of(xs) / comm.size(), to_data_type(xs.scalar_type())),
      what);
  return y;
}

struct AllgatherFunction : torch::autograd::Function<AllgatherFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm) {
    save_communicator(ctx, comm);
    return run_allgather(*comm, contiguous_for_comm(x, "allgather"), "allgather");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return grads({run_reduce_scatter(load_communicator(ctx),
                                     contiguous_for_comm(grad_outputs[0], "allgather backward"),
                                     "allgather backward: reduce_scatter")});
  }
};

// ChainerMN's allgather: every rank's x, each with its own shape. `shapes` (every rank's, in rank
// order) were exchanged before; the forward is one allgatherv into a flat buffer, and each output
// is its own copy (not a view of a shared buffer, so outputs may be modified in place).
struct AllgatherListFunction : torch::autograd::Function<AllgatherListFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm,
                               std::vector<std::vector<int64_t>> shapes) {
    save_communicator(ctx, comm);
    at::Tensor xc = contiguous_for_comm(x, "allgather");
    std::vector<size_t> counts;
    std::vector<int64_t> numels;
    for (const auto& shape : shapes) {
      numels.push_back(c10::multiply_integers(shape));
      counts.push_back(static_cast<size_t>(numels.back()));
    }
    int64_t total = 0;
    for (int64_t n : numels) total += n;
    at::Tensor flat = at::empty({total}, xc.options());
    sync_before_comm(xc);
    wait_or_throw(comm->allgatherv(xc.data_ptr(), flat.data_ptr(), counts, to_data_type(xc.scalar_type())),
                  fmt::format("allgather of {} elements", xc.numel()));
    ctx->saved_data["numels"] = numels;
    variable_list out;
    int64_t offset = 0;
    for (size_t r = 0; r < shapes.size(); ++r) {
      out.push_back(flat.narrow(0, offset, numels[r]).view(shapes[r]).clone());
      offset += numels[r];
    }
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    Communicator& comm = load_communicator(ctx);
    std::vector<int64_t> numels = ctx->saved_data["numels"].toIntVector();
    // A result the loss never used has an undefined gradient: zero. The options come from a
    // defined one (there is at least one: backward runs because some result was used).
    at::TensorOptions options;
    for (const at::Tensor& g : grad_outputs) {
      if (g.defined()) options = g.options();
    }
    std::vector<at::Tensor> flat_grads;
    std::vector<size_t> counts;
    for (size_t r = 0; r < numels.size(); ++r) {
      const at::Tensor& g = grad_outputs[r];
      flat_grads.push_back(g.defined() ? g.reshape({-1}) : at::zeros({numels[r]}, options));
      counts.push_back(static_cast<size_t>(numels[r]));
    }
    at::Tensor all = contiguous_for_comm(at::cat(flat_grads), "allgather backward");
    at::Tensor mine = at::empty({numels[comm.rank()]}, all.options());
    sync_before_comm(all);
    wait_or_throw(comm.reduce_scatterv(all.data_ptr(), mine.data_ptr(), counts, to_data_type(all.scalar_type()),
                                       ReduceOp::kSum),
                  "allgather backward: reduce_scatterv");
    return grads({mine});  // the input was flattened: the reshape's backward restores x's shape
  }
};

struct ReduceScatterFunction : torch::autograd::Function<ReduceScatterFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& xs, Communicator* comm) {
    save_communicator(ctx, comm);
    return run_reduce_scatter(*comm, contiguous_for_comm(xs, "reduce_scatter"), "reduce_scatter");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return grads({run_allgather(load_communicator(ctx),
                                contiguous_for_comm(grad_outputs[0], "reduce_scatter backward"),
                                "reduce_scatter backward: allgather")});
  }
};

struct AlltoallFunction : torch::autograd::Function<AlltoallFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& xs, Communicator* comm) {
    save_communicator(ctx, comm);
    return run_alltoall(*comm, contiguous_for_comm(xs, "alltoall"), "alltoall");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return grads(
        {run_alltoall(load_communicator(ctx), contiguous_for_comm(grad_outputs[0], "alltoall backward"),
                      "alltoall backward")});
  }
};

// Root tells every rank the dtype and shape of `x` (bcast, scatter: non-root ranks pass none),
// and whether it is on a GPU: ranks that name no device follow the root, so every rank passes the
// same kind of memory to the communicator (which NCCL kinds require).
void exchange_meta(Communicator& comm, const at::Tensor& x, int root, const char* op, at::ScalarType* type,
                   std::vector<int64_t>* shape, bool* root_on_cuda) {
  std::string meta;
  if (comm.rank() == root) {
    if (!x.defined())
      throw std::runtime_error(fmt::format("cohort autograd: {}: root {} passed no tensor", op, root));
    meta = (x.is_cuda() ? "c" : "h") + encode_meta(x.scalar_type(), x.sizes());
  }
  auto agreed = comm.bcast_obj(meta, root);
  throw_if_error(agreed.status(), fmt::format("{}: shape exchange from root {}", op, root));
  *root_on_cuda = !agreed->empty() && agreed->front() == 'c';
  decode_meta(agreed->substr(1), type, shape);
}

// The input of a non-root rank for ops whose backward must run there although it has no data;
// on `device`, the result's.
at::Tensor anchor_for(at::ScalarType type, at::Device device) {
  if (!c10::GradMode::is_enabled() || !is_differentiable(type)) return make_inert_anchor(device);
  return make_anchor(at::TensorOptions(type).device(device));
}

// Where a root-sourced result lands on this rank: x's device at root, else `device` (given),
// else the device of x when a template is passed, else the communicator's GPU when the root's
// tensor is on one (cuda:0 when the communicator has none), else the CPU.
at::Device result_device(const Communicator& comm, const at::Tensor& x, int root,
                         const std::optional<at::Device>& device, bool root_on_cuda) {
  if (comm.rank() == root) return x.device();
  if (device.has_value()) return *device;
  if (x.defined()) return x.device();
  if (!root_on_cuda) return at::Device(at::kCPU);
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(std::max(comm.cuda_device(), 0)));
}

}  // namespace

at::Tensor allreduce(Communicator& comm, const at::Tensor& x, ReduceOp op) {
  check_gradient_dtype(x, "allreduce");
  return AllreduceFunction::apply(x, &comm, static_cast<int64_t>(op));
}

at::Tensor bcast(Communicator& comm, const at::Tensor& x, int root, std::optional<at::Device> device) {
  check_root(comm, root, "bcast");
  check_gradient_dtype(x, "bcast");
  at::ScalarType type;
  std::vector<int64_t> shape;
  bool root_on_cuda = false;
  exchange_meta(comm, x, root, "bcast", &type, &shape, &root_on_cuda);
  at::Device on = result_device(comm, x, root, device, root_on_cuda);
  at::Tensor input = comm.rank() == root ? x : anchor_for(type, on);
  return BcastFunction::apply(input, &comm, static_cast<int64_t>(root), shape, type, on);
}

at::Tensor reduce(Communicator& comm, const at::Tensor& x, int root) {
  check_root(comm, root, "reduce");
  check_gradient_dtype(x, "reduce");
  return ReduceFunction::apply(x, &comm, static_cast<int64_t>(root));
}

at::Tensor gather(Communicator& comm, const at::Tensor& x, int root) {
  check_root(comm, root, "gather");
  check_gradient_dtype(x, "gather");
  return GatherFunction::apply(x, &comm, static_cast<int64_t>(root));
}

at::Tensor scatter(Communicator& comm, const at::Tensor& xs, int root, std::optional<at::Device> device) {
  check_root(comm, root, "scatter");
  check_gradient_dtype(xs, "scatter");
  if (comm.rank() == root) check_blocks(comm, xs, "scatter");
  at::ScalarType type;
  std::vector<int64_t> shape;
  bool root_on_cuda = false;
  exchange_meta(comm, xs, root, "scatter", &type, &shape, &root_on_cuda);
  at::Device on = result_device(comm, xs, root, device, root_on_cuda);
  at::Tensor input = comm.rank() == root ? xs : anchor_for(type, on);
  return ScatterFunction::apply(input, &comm, static_cast<int64_t>(root), shape, type, on);
}

std::vector<at::Tensor> allgather(Communicator& comm, const at::Tensor& x) {
  check_gradient_dtype(x, "allgather");
  if (!x.defined()) throw std::runtime_error("cohort autograd: allgather: the tensor is undefined");
  // Every rank's dtype and shape (ChainerMN exchanges the shapes the same way).
  auto metas = comm.allgather_obj(encode_meta(x.scalar_type(), x.sizes()));
  throw_if_error(metas.status(), "allgather: shape exchange");
  std::vector<std::vector<int64_t>> shapes(metas->size());
  std::string types;
  bool same_type = true;
  for (size_t r = 0; r < metas->size(); ++r) {
    at::ScalarType type;
    decode_meta((*metas)[r], &type, &shapes[r]);
    same_type = same_type && type == x.scalar_type();
    types += fmt::format("{}rank {}: {}", r == 0 ? "" : ", ", r, c10::toString(type));
  }
  if (!same_type) {
    throw std::runtime_error(fmt::format(
        "cohort autograd: allgather over {}: ranks passed different dtypes ({}); cast to one dtype first",
        comm.description(), types));
  }
  // The gradient comes back flat: the input is flattened first, so the custom function's gradient
  // needs no reshape (a view keeps x's graph edge).
  return AllgatherListFunction::apply(x.reshape({-1}), &comm, shapes);
}

at::Tensor allgather_stacked(Communicator& comm, const at::Tensor& x) {
  check_gradient_dtype(x, "allgather");
  return AllgatherFunction::apply(x, &comm);
}

at::Tensor reduce_scatter(Communicator& comm, const at::Tensor& xs) {
  check_gradient_dtype(xs, "reduce_scatter");
  check_blocks(comm, xs, "reduce_scatter");
  return ReduceScatterFunction::apply(xs, &comm);
}

at::Tensor alltoall(Communicator& comm, const at::Tensor& xs) {
  check_gradient_dtype(xs, "alltoall");
  check_blocks(comm, xs, "alltoall");
  return AlltoallFunction::apply(xs, &comm);
}

}  // namespace cohort::autograd
