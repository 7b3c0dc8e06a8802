#pragma once

// Model parallelism by pipeline links (ChainerMN's MultiNodeChainList): a model is a list of
// links, each placed on this rank, that receive their inputs from other ranks, run a module and
// send the output on. Every rank builds its own list with the links it runs, in the same global
// order as its peers (a link's sends must meet the matching receives in the same order).
//
//   // A 3-stage MLP over ranks 0 → 1 → 2, loss on rank 2.
//   MultiNodeChainList chain(*comm);
//   if (rank == 0) chain.add_link(stage0, kNone, 1);
//   if (rank == 1) chain.add_link(stage1, 0, 2);
//   if (rank == 2) chain.add_link(stage2, 1, kNone);
//   at::Tensor y = chain.forward(x);                       // x is only used by rank 0
//   if (rank == 2) loss_of(y).backward(); else y.backward();  // y is a delegate on 0 and 1
//
// A link with rank_out none need not be the last (ChainerMN's NonConnectedGraph2): its output is
// the chain's output, the links after it run after it, and forward returns that output with the
// later links' send delegates attached (pseudo_connect), so backward reaches them first:
//
//   // rank 0: sub_a turns what rank 1 sent into the output; then sub_b sends f(x) to rank 1.
//   chain.add_link(sub_a, 1, kNone);
//   chain.add_link(sub_b, kNone, 1);
//   at::Tensor y = chain.forward(x);   // sub_a's output, with sub_b's send hanging off it
//   loss_of(y).backward();             // receives sub_b's gradient, then sends sub_a's input's
//
// Shapes and dtypes travel with the data (a small header message before each tensor), so a link
// need not know what it receives. Backward runs the transfers in reverse without deadlock: each
// receive takes the delegate of this rank's earlier sends, so their gradients are received only
// after this rank's later gradients were sent (worker/autograd's README, "non-connected graph").

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "worker/comm/communicator.h"

namespace cohort::train {

// The ranks a link receives from or sends to: none, one, or several (in this order).
class LinkRanks {
 public:
  LinkRanks() = default;                 // none
  LinkRanks(int rank) : ranks_{rank} {}  // NOLINT: implicit, as in add_link(m, 0, 1)
  LinkRanks(std::initializer_list<int> ranks) : ranks_(ranks) {}
  LinkRanks(std::vector<int> ranks) : ranks_(std::move(ranks)) {}  // NOLINT

  bool empty() const { return ranks_.empty(); }
  const std::vector<int>& ranks() const { return ranks_; }

 private:
  std::vector<int> ranks_;
};

// "No rank": the link takes the chain's input (rank_in) or its output is the chain's (rank_out).
inline const LinkRanks kNone{};

// A link's computation: its inputs (one per rank_in, in order; the chain's input when rank_in is
// none) → its output.
using LinkFunction = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

struct MultiNodeChainListOptions {
  // Run check_layout() by itself in the first forward (and the first after an add_link), so a
  // layout whose transfers cannot meet is an error on every rank instead of a forward that waits
  // for the communicator's timeout. It costs one allgather_obj per (re)built chain and needs every
  // rank of the communicator to call forward, a rank without links too; false leaves the check
  // to an explicit check_layout() (or none). Set it alike on every rank: a rank that checks
  // waits in the check's collective for ranks that do not.
  bool check_layout_before_first_forward = true;
};

class MultiNodeChainList : public torch::nn::Module {
 public:
  // `comm` must outlive this object and every graph its forward builds. Received tensors are
  // allocated on `device` (CPU or CUDA), which to(device) updates. Local.
  explicit MultiNodeChainList(comm::Communicator& comm, at::Device device = at::kCPU,
                              MultiNodeChainListOptions options = {});

  // Module::to, which also makes `device` the device of received tensors (so chain->to(cuda)
  // moves the links and the activations they receive).
  using torch::nn::Module::to;
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;
  at::Device device() const { return device_; }

  // Appends a link running `fn`; `module` (may be null) holds its parameters and is registered
  // as a submodule "link<i>" so parameters(), to() and state dicts see it. Refuses, with
  // std::invalid_argument naming the link, what forward could not run: a rank out of range or
  // equal to this rank (ChainerMN's send-to-self queue is not supported), and a second link with
  // rank_out none (a chain has one output). Layouts that only fail across ranks (a receive no
  // peer sends, a cycle of waits) cannot be seen here: the next forward runs check_layout()
  // (collective) first and refuses them (unless options turned that off), and graph jobs are
  // checked before they start (graph::validate_model simulates the stages' transfers;
  // validate_job_spec refuses what this method refuses). Not thread-safe.
  void add_link(std::shared_ptr<torch::nn::Module> module, LinkFunction fn, LinkRanks rank_in,
                LinkRanks rank_out);

  // A module whose forward takes one tensor (Linear, Sequential, Conv2d, ...); its rank_in must
  // name at most one rank (refused here otherwise).
  template <typename M>
  void add_link(std::shared_ptr<M> module, LinkRanks rank_in, LinkRanks rank_out) {
    check_single_input(rank_in);
    M* raw = module.get();
    add_link(
        std::static_pointer_cast<torch::nn::Module>(module),
        [raw](const std::vector<at::Tensor>& inputs) { return raw->forward(single_input(inputs)); },
        std::move(rank_in), std::move(rank_out));
  }
  template <typename Holder, typename = decltype(std::declval<Holder>().ptr())>
  void add_link(const Holder& holder, LinkRanks rank_in, LinkRanks rank_out) {
    add_link(holder.ptr(), std::move(rank_in), std::move(rank_out));
  }

  // Runs the links in add order: receive each input from rank_in (or take `x`), run the link,
  // send the output to each rank in rank_out. Returns the output of the link with no rank_out
  // (wherever it stands in the list), otherwise a 0-dim delegate whose backward() runs this
  // rank's part of the backward. Every send's delegate is joined into what is returned
  // (pseudo_connect), so one backward() per rank suffices; links after the output link follow
  // it in forward and precede it in backward, as ChainerMN orders them. Blocking (each transfer
  // within the communicator's timeout; a missing peer is an error, not a hang); throws
  // std::runtime_error on failure. `x` may be undefined on ranks whose links all receive.
  // Collective the first time (and the first time after an add_link): unless
  // options.check_layout_before_first_forward is false or check_layout() already ran on these
  // links, it runs check_layout() before any transfer, so every rank of the communicator calls
  // forward (a rank without links too), and a layout that cannot run throws
  // std::invalid_argument on every rank as soon as they all arrived.
  at::Tensor forward(const at::Tensor& x = at::Tensor());

  // Collective: every rank of the communicator calls it (a rank without links too), once the
  // links are added. Gathers every rank's links and throws std::invalid_argument, on every rank
  // alike, when their transfers cannot all meet: a receive no peer sends, a send no peer
  // receives, or a cycle of waits. Each rank runs its links in order (receives in rank_in order,
  // then sends in rank_out order) and a send is taken to wait for its receive, as large tensors
  // do over UCX, so an order that only buffered sends would save is refused too (the check
  // graph::validate_model runs for graph jobs). Backward runs the transfers in reverse, so a
  // layout that passes cannot deadlock there either. Blocking (one allgather_obj within the
  // communicator's timeout); throws std::runtime_error when that fails (a rank that never calls
  // it or forward). forward runs it by itself (MultiNodeChainListOptions); calling it explicitly
  // checks earlier, e.g. before loading data, and the first forward then does not repeat it.
  void check_layout();
  // Whether check_layout() passed on the current links (forward then skips it).
  bool layout_checked() const { return layout_checked_; }

  size_t num_links() const { return links_.size(); }
  // Whether a link has rank_out none, i.e. forward returns a model output rather than a delegate.
  bool has_output() const { return output_link_ >= 0; }

 private:
  struct Link {
    LinkFunction fn;
    std::vector<int> rank_in;
    std::vector<int> rank_out;
  };

  static const at::Tensor& single_input(const std::vector<at::Tensor>& inputs);
  void check_single_input(const LinkRanks& rank_in) const;
  void check_rank(int peer, const char* what) const;
  // One tensor to / from `peer` with its dtype and shape; tags count the messages exchanged with
  // that peer in this forward, so both sides agree without a global numbering.
  at::Tensor send_to(int peer, const at::Tensor& y, std::map<int, uint32_t>& sent);
  at::Tensor recv_from(int peer, const at::Tensor& delegate, std::map<int, uint32_t>& received);

  comm::Communicator& comm_;
  at::Device device_;
  const MultiNodeChainListOptions options_;
  std::vector<Link> links_;
  int output_link_ = -1;         // the link with rank_out none, or -1
  bool layout_checked_ = false;  // check_layout() passed since the last add_link
};

}  // namespace cohort::train
