#include "worker/autograd/wait_handle.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>
#include <string>

#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <c10/util/accumulate.h>
#include <torch/csrc/autograd/custom_function.h>

#include "worker/autograd/point_to_point_functions.h"
#include "worker/autograd/tensor_comm.h"
#include "worker/autograd/tensor_header.h"

namespace cohort::autograd {

namespace {

// The sends of dropped transfer states that had not completed, with the buffers they read: kept
// until the transport is done with them, swept whenever a transfer state goes.
struct UnfinishedSend {
  std::vector<std::shared_ptr<comm::Work>> works;
  at::Tensor buffer;
  std::shared_ptr<TensorHeader> header;
};

std::mutex& unfinished_sends_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<UnfinishedSend>& unfinished_sends() {
  static auto* sends = new std::vector<UnfinishedSend>();  // never destroyed: sends may outlive main
  return *sends;
}

bool unfinished(const std::shared_ptr<comm::Work>& work) { return work != nullptr && !work->is_completed(); }

// Unfinished after a zero wait, which cancels a transfer past its deadline (as any wait() past
// it would), so a send whose receive never comes is not kept for ever.
bool still_running(const std::shared_ptr<comm::Work>& work) {
  if (!unfinished(work)) return false;
  work->wait(comm::Duration::zero()).ignore_error();
  return unfinished(work);
}

// Keeps `send` (when any of its works is unfinished) and lets go of those that completed.
void keep_until_sent(UnfinishedSend send) {
  std::lock_guard<std::mutex> lock(unfinished_sends_mutex());
  auto& sends = unfinished_sends();
  sends.erase(std::remove_if(sends.begin(), sends.end(),
                             [](const UnfinishedSend& s) { return std::none_of(s.works.begin(), s.works.end(), still_running); }),
              sends.end());
  if (std::any_of(send.works.begin(), send.works.end(), unfinished)) sends.push_back(std::move(send));
}

using comm::Communicator;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kStateKey = "transfer";

c10::intrusive_ptr<TransferState> load_state(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<TransferState>(ctx->saved_data.at(kStateKey).toCapsule());
}

void save_state(AutogradContext* ctx, const c10::intrusive_ptr<TransferState>& state) {
  ctx->saved_data[kStateKey] = at::IValue::make_capsule(state);
}

// On the transfer's device, like everything else of the transfer.
at::Tensor make_dummy(const TransferState& state) {
  return at::zeros(
      {}, at::TensorOptions(is_differentiable(state.type) ? state.type : at::kFloat).device(state.device));
}

// Completes the reverse transfer that the Wait's backward posted (none when it does not happen).
void finish_reverse(const TransferState& state) {
  if (!state.reverse) return;
  if (!state.grad_work) {
    throw std::runtime_error(fmt::format(
        "cohort autograd: backward of {}: the wait() of this handle is not part of the backward graph, so the "
        "gradient transfer was never posted; join the wait() output into the loss with join_dummies",
        state.describe()));
  }
  wait_or_throw(state.grad_work, fmt::format("backward of {}: gradient transfer", state.describe()));
}

// Completes the header's transfer. For an irecv, checks what the sender announced against what
// was posted; on a mismatch (or a failed header) the data's transfer is still completed, so no
// receive is left posted into a buffer, and the call throws naming both sides.
void finish_header(TransferState& state) {
  if (!state.header_work) return;
  Status header_status = state.header_work->wait();
  state.header_work.reset();
  std::string problem;
  if (!header_status.ok()) {
    problem = fmt::format("header: {}", header_status.to_string());
  } else if (!state.is_send) {
    at::ScalarType sent_type;
    std::vector<int64_t> sent_shape;
    bool sent_requires_grad = false;
    Status parsed = parse_tensor_header(*state.header, &sent_type, &sent_shape, &sent_requires_grad);
    // A sender whose tensor did not require grad posts no receive for its gradient.
    state.reverse = sent_requires_grad;
    if (!parsed.ok()) {
      problem = parsed.to_string();
    } else if (sent_type != state.type ||
               c10::multiply_integers(sent_shape) != c10::multiply_integers(state.shape)) {
      problem = fmt::format(
          "the sender sent {} but this rank posted {}: the dtype must match and the shape hold as many elements",
          describe_tensor(sent_type, sent_shape), describe_tensor(state.type, state.shape));
    }
  }
  if (problem.empty()) return;
  Status ignored = state.work->wait();
  (void)ignored;
  state.work.reset();
  throw std::runtime_error(fmt::format("cohort autograd: wait for {}: {}", state.describe(), problem));
}

struct IsendFunction : torch::autograd::Function<IsendFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<TransferState> state) {
    save_state(ctx, state);
    state->buffer = contiguous_for_comm(x, "isend").clone();
    to_data_type(state->type);  // refuses what cannot travel, before the header
    StatusOr<TensorHeader> header = make_tensor_header(state->type, state->buffer.sizes(), state->reverse);
    throw_if_error(header.status(), state->describe());
    state->header = std::make_shared<TensorHeader>(*header);
    state->header_work = state->comm->isend(state->header->data(), kHeaderWords, comm::DataType::kInt64,
                                            state->peer, state->tag | kHeaderTagBit);
    sync_before_comm(state->buffer);
    state->work = state->comm->isend(state->buffer.data_ptr(), static_cast<size_t>(state->buffer.numel()),
                                     to_data_type(state->type), state->peer, state->tag);
    return make_dummy(*state);
  }

  static variable_list backward(AutogradContext* ctx, variable_list /*grad_outputs*/) {
    auto state = load_state(ctx);
    finish_reverse(*state);
    at::Tensor grad = state->grad_buffer;
    if (state->wait_output_grad.defined()) grad = grad.add(state->wait_output_grad);
    state->grad_buffer = at::Tensor();
    state->grad_work.reset();
    return {grad, at::Tensor()};
  }
};

struct IrecvFunction : torch::autograd::Function<IrecvFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& anchor, c10::intrusive_ptr<TransferState> state) {
    save_state(ctx, state);
    if (anchor.defined()) ctx->save_for_backward({anchor});
    state->buffer = at::empty(state->shape, at::TensorOptions(state->type).device(state->device));
    state->header = std::make_shared<TensorHeader>();
    state->header->fill(0);
    state->header_work = state->comm->irecv(state->header->data(), kHeaderWords, comm::DataType::kInt64,
                                            state->peer, state->tag | kHeaderTagBit);
    sync_before_comm(state->buffer);
    state->work = state->comm->irecv(state->buffer.data_ptr(), static_cast<size_t>(state->buffer.numel()),
                                     to_data_type(state->type), state->peer, state->tag);
    return make_dummy(*state);
  }

  static variable_list backward(AutogradContext* ctx, variable_list /*grad_outputs*/) {
    auto state = load_state(ctx);
    finish_reverse(*state);
    state->grad_buffer = at::Tensor();
    state->grad_work.reset();
    auto saved = ctx->get_saved_variables();
    return {saved.empty() ? at::Tensor() : at::zeros_like(saved[0]), at::Tensor()};
  }
};

struct WaitFunction : torch::autograd::Function<WaitFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dummy, c10::intrusive_ptr<TransferState> state) {
    save_state(ctx, state);
    ctx->save_for_backward({dummy});
    if (state->waited) {
      throw std::runtime_error(fmt::format("cohort autograd: wait: {} was already waited for", state->describe()));
    }
    finish_header(*state);
    wait_or_throw(state->work, fmt::format("wait for {}", state->describe()));
    state->waited = true;
    state->work.reset();
    // The buffer is ours (isend copied x, irecv allocated it): hand it out without a copy.
    return std::move(state->buffer);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = load_state(ctx);
    Communicator& comm = *state->comm;
    uint32_t grad_tag = state->tag | kGradientTagBit;
    if (!state->reverse) {
      // irecv of a tensor that did not require grad on its sender: no gradient goes back.
    } else if (state->is_send) {
      // The gradient of what we sent comes back from the peer: post the receive now, complete it
      // in the isend node's backward.
      state->wait_output_grad = grad_outputs[0];
      state->grad_buffer = at::empty(state->shape, at::TensorOptions(state->type).device(state->device));
      sync_before_comm(state->grad_buffer);
      state->grad_work = comm.irecv(state->grad_buffer.data_ptr(), static_cast<size_t>(state->grad_buffer.numel()),
                                    to_data_type(state->type), state->peer, grad_tag);
    } else {
      state->grad_buffer = contiguous_for_comm(grad_outputs[0], "wait backward");
      sync_before_comm(state->grad_buffer);
      state->grad_work = comm.isend(state->grad_buffer.data_ptr(), static_cast<size_t>(state->grad_buffer.numel()),
                                    to_data_type(state->type), state->peer, grad_tag);
    }
    return {at::zeros_like(ctx->get_saved_variables()[0]), at::Tensor()};
  }
};

c10::intrusive_ptr<TransferState> make_state(Communicator& comm, bool is_send, int peer, uint32_t tag,
                                             std::vector<int64_t> shape, at::ScalarType type,
                                             at::Device device) {
  auto state = c10::make_intrusive<TransferState>();
  state->comm = &comm;
  state->is_send = is_send;
  state->peer = peer;
  state->tag = tag;
  state->shape = std::move(shape);
  state->type = type;
  state->device = device;
  return state;
}

}  // namespace

TransferState::~TransferState() {
  // isend: the forward transfer and its header are sends, the reverse one a receive; irecv the
  // other way round. Receives go first, cancelled if unfinished (P2PWork), before their buffers.
  if (is_send) {
    grad_work.reset();
    keep_until_sent({{work, header_work}, buffer, header});
  } else {
    header_work.reset();
    work.reset();
    keep_until_sent({{grad_work}, grad_buffer, nullptr});
  }
}

WaitHandle::WaitHandle(at::Tensor dummy, c10::intrusive_ptr<TransferState> state)
    : dummy_(std::move(dummy)), state_(std::move(state)) {}

WaitHandle isend(Communicator& comm, const at::Tensor& x, int peer, uint32_t tag) {
  check_peer(comm, peer, tag, "isend");
  check_gradient_dtype(x, "isend");
  if (!x.defined()) throw std::runtime_error("cohort autograd: isend: the tensor is undefined");
  auto state = make_state(comm, /*is_send=*/true, peer, tag, x.sizes().vec(), x.scalar_type(), x.device());
  // What autograd's apply records a node for: only then does this rank's backward receive a
  // gradient, and the header tells the receiver whether to send one.
  state->reverse = c10::GradMode::is_enabled() && x.requires_grad();
  at::Tensor dummy = IsendFunction::apply(x, state);
  return WaitHandle(dummy, state);
}

WaitHandle irecv(Communicator& comm, int peer, uint32_t tag, const at::Tensor& delegate,
                 const std::optional<std::vector<int64_t>>& shape, at::ScalarType dtype, at::Device device) {
  check_peer(comm, peer, tag, "irecv");
  if (!shape.has_value()) {
    throw std::runtime_error(fmt::format(
        "cohort autograd: irecv from rank {} (tag {}): no shape given; irecv posts its buffer before the "
        "sender's header arrives, so pass the shape and dtype the peer sends (or use recv, which takes them "
        "from the header)",
        peer, tag));
  }
  to_data_type(dtype);  // refuses what cannot travel before anything is posted
  at::Tensor anchor = recv_anchor(delegate, dtype, device, peer, tag, "irecv");
  auto state = make_state(comm, /*is_send=*/false, peer, tag, *shape, dtype, device);
  at::Tensor dummy = IrecvFunction::apply(anchor, state);
  return WaitHandle(dummy, state);
}

at::Tensor wait(const WaitHandle& handle) { return WaitFunction::apply(handle.dummy(), handle.state()); }

WaitHandle join_dummies_handle(const WaitHandle& handle, at::TensorList dummies) {
  return WaitHandle(join_dummies(handle.dummy(), dummies), handle.state());
}

}  // namespace cohort::autograd
