#include "worker/autograd/point_to_point_functions.h"

#include <stdexcept>
#include <string>

#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/autograd/tensor_comm.h"
#include "worker/autograd/tensor_header.h"

namespace cohort::autograd {
namespace {

using comm::Communicator;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SendFunction : torch::autograd::Function<SendFunction> {
  // `requires_grad`: this node is recorded (x requires grad, grad mode on), so its backward will
  // receive the gradient; the header tells the receiver whether to send one.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm, int64_t peer,
                            int64_t tag, bool requires_grad) {
    save_communicator(ctx, comm);
    ctx->saved_data["peer"] = peer;
    ctx->saved_data["tag"] = tag;
    ctx->saved_data["shape"] = x.sizes().vec();
    at::Tensor xc = contiguous_for_comm(x, "send");
    comm::DataType dtype = to_data_type(xc.scalar_type());  // refuses what cannot travel, before the header
    const std::string what = fmt::format("send to rank {} (tag {})", peer, tag);
    StatusOr<TensorHeader> header = make_tensor_header(xc.scalar_type(), xc.sizes(), requires_grad);
    throw_if_error(header.status(), what);
    // The receiver takes the header first, then the data: two blocking sends in that order.
    throw_if_error(comm->send(header->data(), kHeaderWords, comm::DataType::kInt64, static_cast<int>(peer),
                              static_cast<uint32_t>(tag) | kHeaderTagBit),
                   what + ": header");
    sync_before_comm(xc);
    throw_if_error(comm->send(xc.data_ptr(), static_cast<size_t>(xc.numel()), dtype, static_cast<int>(peer),
                              static_cast<uint32_t>(tag)),
                   what);
    return at::zeros({}, xc.options());  // the delegate
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    Communicator& comm = load_communicator(ctx);
    auto peer = ctx->saved_data["peer"].toInt();
    auto tag = static_cast<uint32_t>(ctx->saved_data["tag"].toInt());
    // The gradient of x, on x's device (the delegate's).
    at::Tensor grad = at::empty(ctx->saved_data["shape"].toIntVector(), grad_outputs[0].options());
    sync_before_comm(grad);
    throw_if_error(comm.recv(grad.data_ptr(), static_cast<size_t>(grad.numel()), to_data_type(grad.scalar_type()),
                             static_cast<int>(peer), tag | kGradientTagBit),
                   fmt::format("send backward: receiving the gradient from rank {} (tag {})", peer, tag));
    return {grad, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct RecvFunction : torch::autograd::Function<RecvFunction> {
  // `send_gradient`: the sender's header said its tensor requires grad, so its backward waits for
  // dL/dy. Otherwise backward sends nothing (no receive would ever take it) and only passes the
  // zero gradient to the delegate.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& anchor, Communicator* comm, int64_t peer,
                            int64_t tag, std::vector<int64_t> shape, at::ScalarType type, at::Device device,
                            bool send_gradient) {
    save_communicator(ctx, comm);
    ctx->saved_data["peer"] = peer;
    ctx->saved_data["tag"] = tag;
    ctx->saved_data["send_gradient"] = send_gradient;
    if (anchor.defined()) ctx->save_for_backward({anchor});
    at::Tensor y = at::empty(shape, at::TensorOptions(type).device(device));
    sync_before_comm(y);
    throw_if_error(comm->recv(y.data_ptr(), static_cast<size_t>(y.numel()), to_data_type(type),
                              static_cast<int>(peer), static_cast<uint32_t>(tag)),
                   fmt::format("recv from rank {} (tag {})", peer, tag));
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    if (ctx->saved_data["send_gradient"].toBool()) {
      Communicator& comm = load_communicator(ctx);
      auto peer = ctx->saved_data["peer"].toInt();
      auto tag = static_cast<uint32_t>(ctx->saved_data["tag"].toInt());
      at::Tensor grad = contiguous_for_comm(grad_outputs[0], "recv backward");
      sync_before_comm(grad);
      throw_if_error(comm.send(grad.data_ptr(), static_cast<size_t>(grad.numel()),
                               to_data_type(grad.scalar_type()), static_cast<int>(peer), tag | kGradientTagBit),
                     fmt::format("recv backward: sending the gradient to rank {} (tag {})", peer, tag));
    }
    auto saved = ctx->get_saved_variables();
    at::Tensor anchor_grad = saved.empty() ? at::Tensor() : at::zeros_like(saved[0]);
    variable_list grads(8);  // one per forward argument; only the anchor is a variable
    grads[0] = anchor_grad;
    return grads;
  }
};

// Outputs `pass` unchanged; `zeroed` are extra inputs that receive zero gradients.
struct JoinFunction : torch::autograd::Function<JoinFunction> {
  static variable_list forward(AutogradContext* ctx, at::TensorList pass, at::TensorList zeroed) {
    ctx->saved_data["num_pass"] = static_cast<int64_t>(pass.size());
    ctx->save_for_backward(zeroed.vec());
    return pass.vec();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    variable_list out(grad_outputs.begin(),
                      grad_outputs.begin() + static_cast<int64_t>(ctx->saved_data["num_pass"].toInt()));
    for (const at::Tensor& z : ctx->get_saved_variables()) out.push_back(z.defined() ? at::zeros_like(z) : z);
    return out;
  }
};

}  // namespace

at::Tensor send(Communicator& comm, const at::Tensor& x, int peer, uint32_t tag) {
  check_peer(comm, peer, tag, "send");
  check_gradient_dtype(x, "send");
  // What autograd's apply records a node for: only then does this rank's backward take a gradient.
  const bool requires_grad = c10::GradMode::is_enabled() && x.defined() && x.requires_grad();
  return SendFunction::apply(x, &comm, static_cast<int64_t>(peer), static_cast<int64_t>(tag), requires_grad);
}

at::Tensor recv(Communicator& comm, int peer, uint32_t tag, const at::Tensor& delegate,
                const std::optional<std::vector<int64_t>>& shape, std::optional<at::ScalarType> dtype,
                at::Device device) {
  check_peer(comm, peer, tag, "recv");
  // With the dtype given, a delegate it cannot carry is refused before anything is received.
  at::Tensor anchor;
  if (dtype.has_value()) anchor = recv_anchor(delegate, *dtype, device, peer, tag, "recv");
  const std::string what = fmt::format("recv from rank {} (tag {})", peer, tag);
  TensorHeader header;
  header.fill(0);
  throw_if_error(comm.recv(header.data(), kHeaderWords, comm::DataType::kInt64, peer, tag | kHeaderTagBit),
                 what + ": header");
  at::ScalarType sent_type;
  std::vector<int64_t> sent_shape;
  bool sent_requires_grad = false;
  throw_if_error(parse_tensor_header(header, &sent_type, &sent_shape, &sent_requires_grad), what);
  const at::ScalarType type = dtype.value_or(sent_type);
  const std::vector<int64_t> out_shape = shape.value_or(sent_shape);
  // The sender's data follows its header whatever happens here: a receive that cannot take it
  // still takes it (and drops it), so the sender completes and the next message on this tag is
  // the next tensor.
  auto drain_and_throw = [&](const std::string& message) {
    at::Tensor scratch = at::empty(sent_shape, at::TensorOptions(sent_type));
    Status ignored = comm.recv(scratch.data_ptr(), static_cast<size_t>(scratch.numel()), to_data_type(sent_type),
                               peer, tag);
    (void)ignored;
    throw std::runtime_error(fmt::format("cohort autograd: {}: {}", what, message));
  };
  if (type != sent_type || c10::multiply_integers(out_shape) != c10::multiply_integers(sent_shape)) {
    drain_and_throw(fmt::format("the sender sent {} but this rank asked for {}: the dtype must match and the "
                                "shape hold as many elements (or pass neither)",
                                describe_tensor(sent_type, sent_shape), describe_tensor(type, out_shape)));
  }
  if (!anchor.defined()) {
    try {
      anchor = recv_anchor(delegate, type, device, peer, tag, "recv");
    } catch (const std::exception& e) {
      drain_and_throw(e.what());
    }
  }
  // The sender's tensor does not require grad (a frozen stage, a target), so no gradient goes
  // back: its backward posts no receive, and one sent anyway would wait out the timeout or stay
  // on the gradient tag for a later backward to take. Without a delegate the result then does
  // not require grad either (as in torch); a delegate still orders the backward through it.
  const bool has_delegate = delegate.defined() && delegate.requires_grad();  // recv_anchor's test
  if (!sent_requires_grad && !has_delegate) anchor = make_inert_anchor(device);
  return RecvFunction::apply(anchor, &comm, static_cast<int64_t>(peer), static_cast<int64_t>(tag), out_shape, type,
                             device, sent_requires_grad);
}

std::vector<at::Tensor> pseudo_connect(const at::Tensor& delegate, at::TensorList actuals) {
  std::vector<at::Tensor> zeroed{delegate};
  return JoinFunction::apply(actuals, at::TensorList(zeroed));
}

at::Tensor pseudo_connect(const at::Tensor& delegate, const at::Tensor& actual) {
  return pseudo_connect(delegate, at::TensorList(actual))[0];
}

at::Tensor join_dummies(const at::Tensor& x, at::TensorList dummies) {
  return JoinFunction::apply(at::TensorList(x), dummies)[0];
}

}  // namespace cohort::autograd
