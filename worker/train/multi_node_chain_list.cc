#include "worker/train/multi_node_chain_list.h"

#include <array>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "worker/autograd/point_to_point_functions.h"
#include "worker/autograd/tensor_comm.h"

namespace cohort::train {
namespace {

// Header: [scalar type, ndim, dims...]; a link's output has at most kMaxDims dimensions.
constexpr int kMaxDims = 8;
constexpr size_t kHeaderLength = 2 + kMaxDims;

// Message k with a peer uses tag 2k (header) and 2k + 1 (data); both below kGradientTagBit.
uint32_t header_tag(uint32_t k) { return 2 * k; }
uint32_t data_tag(uint32_t k) { return 2 * k + 1; }

// `joined` with `next` attached (pseudo_connect): either may be undefined.
at::Tensor join(const at::Tensor& joined, const at::Tensor& next) {
  if (!joined.defined()) return next;
  if (!next.defined()) return joined;
  return autograd::pseudo_connect(joined, next);
}

// "in1,2>out3;" per link: what check_layout gathers from each rank.
std::string encode_links(const std::vector<std::vector<int>>& rank_ins, const std::vector<std::vector<int>>& rank_outs) {
  std::string out;
  for (size_t i = 0; i < rank_ins.size(); ++i) {
    out += fmt::format("{}>{};", fmt::join(rank_ins[i], ","), fmt::join(rank_outs[i], ","));
  }
  return out;
}

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> ranks;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) ranks.push_back(std::stoi(item));
  }
  return ranks;
}

// One transfer of a rank's program: its link, the peer, and the direction.
struct Transfer {
  int link;
  int peer;
  bool send;
};

std::vector<Transfer> decode_program(const std::string& links) {
  std::vector<Transfer> program;
  std::istringstream in(links);
  std::string link;
  for (int i = 0; std::getline(in, link, ';'); ++i) {
    const size_t arrow = link.find('>');
    if (arrow == std::string::npos) continue;
    for (int peer : parse_ranks(link.substr(0, arrow))) program.push_back({i, peer, false});
    for (int peer : parse_ranks(link.substr(arrow + 1))) program.push_back({i, peer, true});
  }
  return program;
}

}  // namespace

MultiNodeChainList::MultiNodeChainList(comm::Communicator& comm, at::Device device,
                                       MultiNodeChainListOptions options)
    : comm_(comm), device_(device), options_(options) {}

void MultiNodeChainList::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  device_ = device;
}

void MultiNodeChainList::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  device_ = device;
}

const at::Tensor& MultiNodeChainList::single_input(const std::vector<at::Tensor>& inputs) {
  if (inputs.size() != 1) {
    throw std::invalid_argument(fmt::format(
        "MultiNodeChainList: a module link takes one input, got {}; pass a LinkFunction for several rank_in",
        inputs.size()));
  }
  return inputs[0];
}

void MultiNodeChainList::check_single_input(const LinkRanks& rank_in) const {
  if (rank_in.ranks().size() > 1) {
    throw std::invalid_argument(fmt::format(
        "MultiNodeChainList::add_link: link {} (rank {}) is a module taking one tensor, but its rank_in names {} "
        "ranks; pass a LinkFunction that combines the inputs",
        links_.size(), comm_.rank(), rank_in.ranks().size()));
  }
}

void MultiNodeChainList::check_rank(int peer, const char* what) const {
  if (peer < 0 || peer >= comm_.size() || peer == comm_.rank()) {
    throw std::invalid_argument(fmt::format(
        "MultiNodeChainList::add_link: link {} (rank {}): {} {} must be another rank in [0, {}); a link "
        "cannot send to or receive from its own rank",
        links_.size(), comm_.rank(), what, peer, comm_.size()));
  }
}

void MultiNodeChainList::add_link(std::shared_ptr<torch::nn::Module> module, LinkFunction fn,
                                  LinkRanks rank_in, LinkRanks rank_out) {
  if (!fn) {
    throw std::invalid_argument(
        fmt::format("MultiNodeChainList::add_link: link {} (rank {}): empty link function", links_.size(),
                    comm_.rank()));
  }
  for (int peer : rank_in.ranks()) check_rank(peer, "rank_in");
  for (int peer : rank_out.ranks()) check_rank(peer, "rank_out");
  // forward returns one tensor; a second output would be dropped and its backward never run.
  if (rank_out.empty() && output_link_ >= 0) {
    throw std::invalid_argument(fmt::format(
        "MultiNodeChainList::add_link: link {} (rank {}) has rank_out none, but link {} already gives the "
        "chain's output; a chain has one output (as in ChainerMN): send one of them on, or combine them in "
        "one link",
        links_.size(), comm_.rank(), output_link_));
  }
  if (module != nullptr) register_module("link" + std::to_string(links_.size()), std::move(module));
  if (rank_out.empty()) output_link_ = static_cast<int>(links_.size());
  links_.push_back(Link{std::move(fn), rank_in.ranks(), rank_out.ranks()});
  layout_checked_ = false;  // a new link: the next forward checks the layout again
}

void MultiNodeChainList::check_layout() {
  std::vector<std::vector<int>> rank_ins, rank_outs;
  for (const Link& link : links_) {
    rank_ins.push_back(link.rank_in);
    rank_outs.push_back(link.rank_out);
  }
  StatusOr<std::vector<std::string>> gathered = comm_.allgather_obj(encode_links(rank_ins, rank_outs));
  autograd::throw_if_error(
      gathered.status(),
      fmt::format("MultiNodeChainList::check_layout (rank {} of {}, {} links): gathering the ranks' links; every "
                  "rank of the communicator calls check_layout or forward (a rank without links too), or "
                  "MultiNodeChainListOptions::check_layout_before_first_forward = false leaves it out",
                  comm_.rank(), comm_.size(), links_.size()));
  std::vector<std::vector<Transfer>> programs;
  for (const std::string& links : *gathered) programs.push_back(decode_program(links));
  // Run every rank's program as far as it goes: a transfer completes when both ends are at it.
  // Messages between two ranks pair up in order (the tags count them), so the current steps match.
  const int size = static_cast<int>(programs.size());
  std::vector<size_t> at(size, 0);
  auto current = [&](int rank) -> const Transfer* {
    return rank >= 0 && rank < size && at[rank] < programs[rank].size() ? &programs[rank][at[rank]] : nullptr;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int rank = 0; rank < size; ++rank) {
      const Transfer* mine = current(rank);
      if (mine == nullptr) continue;
      const Transfer* theirs = current(mine->peer);
      if (theirs != nullptr && theirs->peer == rank && theirs->send != mine->send) {
        ++at[rank];
        ++at[mine->peer];
        progress = true;
      }
    }
  }
  std::vector<std::string> stuck;
  for (int rank = 0; rank < size; ++rank) {
    if (const Transfer* mine = current(rank)) {
      const Transfer* theirs = current(mine->peer);
      stuck.push_back(fmt::format(
          "rank {} waits at link {} to {} rank {}, which {}", rank, mine->link,
          mine->send ? "send to" : "receive from", mine->peer,
          theirs == nullptr ? fmt::format("has no further link that {} rank {}", mine->send ? "receives from" : "sends to", rank)
                            : fmt::format("waits at link {} to {} rank {}", theirs->link,
                                          theirs->send ? "send to" : "receive from", theirs->peer)));
    }
  }
  if (!stuck.empty()) {
    throw std::invalid_argument(fmt::format(
        "MultiNodeChainList::check_layout: the ranks' links cannot run: each rank runs its links in order and a "
        "send waits for its receive, so {}; reorder the links or their rank_in / rank_out",
        fmt::join(stuck, "; ")));
  }
  layout_checked_ = true;
}

at::Tensor MultiNodeChainList::send_to(int peer, const at::Tensor& y, std::map<int, uint32_t>& sent) {
  if (y.dim() > kMaxDims) {
    throw std::invalid_argument(
        fmt::format("MultiNodeChainList: cannot send a {}-dim output (at most {})", y.dim(), kMaxDims));
  }
  uint32_t k = sent[peer]++;
  std::array<int64_t, kHeaderLength> header{};
  header[0] = static_cast<int64_t>(y.scalar_type());
  header[1] = y.dim();
  for (int64_t d = 0; d < y.dim(); ++d) header[2 + d] = y.size(d);
  autograd::throw_if_error(
      comm_.send(header.data(), header.size(), comm::DataType::kInt64, peer, header_tag(k)),
      fmt::format("MultiNodeChainList: sending the header of message {} to rank {}", k, peer));
  return autograd::send(comm_, y, peer, data_tag(k));
}

at::Tensor MultiNodeChainList::recv_from(int peer, const at::Tensor& delegate,
                                         std::map<int, uint32_t>& received) {
  uint32_t k = received[peer]++;
  std::array<int64_t, kHeaderLength> header{};
  autograd::throw_if_error(
      comm_.recv(header.data(), header.size(), comm::DataType::kInt64, peer, header_tag(k)),
      fmt::format("MultiNodeChainList: receiving the header of message {} from rank {}", k, peer));
  if (header[1] < 0 || header[1] > kMaxDims) {
    throw std::runtime_error(
        fmt::format("MultiNodeChainList: bad header from rank {}: {} dims", peer, header[1]));
  }
  std::vector<int64_t> shape(header.begin() + 2, header.begin() + 2 + header[1]);
  return autograd::recv(comm_, peer, data_tag(k), delegate, shape, static_cast<at::ScalarType>(header[0]),
                        device_);
}

at::Tensor MultiNodeChainList::forward(const at::Tensor& x) {
  // Before any transfer: a layout that cannot run is refused on every rank once they all arrived,
  // rather than found by the first transfer that waits out the communicator's timeout.
  if (options_.check_layout_before_first_forward && !layout_checked_) check_layout();
  std::map<int, uint32_t> sent;
  std::map<int, uint32_t> received;
  // The delegates of sends (and the output) not yet attached to anything later in this rank's
  // graph. Whatever a later link attaches gets a zero gradient from it, so its own backward
  // waits until that later link's backward ran.
  at::Tensor pending;
  // The output of the link with rank_out none.
  at::Tensor output;
  for (const Link& link : links_) {
    std::vector<at::Tensor> inputs;
    if (link.rank_in.empty()) {
      // The chain's input: earlier sends hang off it so backward still reaches them.
      inputs.push_back(pending.defined() && x.defined() ? autograd::pseudo_connect(pending, x) : x);
      if (x.defined()) pending = at::Tensor();
    } else {
      // Every receive of the link takes the pending delegate: its gradient is sent back to the
      // peer before this rank waits for the gradients of its own earlier sends.
      for (int peer : link.rank_in) inputs.push_back(recv_from(peer, pending, received));
      pending = at::Tensor();
    }
    at::Tensor y = link.fn(inputs);
    if (link.rank_out.empty()) {
      // The chain's output. Earlier unattached sends hang off it; links after it take it as their
      // delegate (ChainerMN's delegate_variable = y), so in backward the output's own graph runs
      // only after theirs: their transfers were later in forward and must come first in reverse.
      // (An output without gradient orders nothing: a receive taking it would lose its anchor.)
      output = join(pending, y);
      pending = output.requires_grad() ? output : at::Tensor();
    } else {
      for (int peer : link.rank_out) pending = join(pending, send_to(peer, y, sent));
    }
  }
  // The output came last (or nothing is pending): it is the result as it is. Otherwise the later
  // links' delegates are attached to it (NonConnectedGraph2), or, with no output, returned.
  if (!output.defined()) return pending;
  if (!pending.defined() || pending.is_same(output)) return output;
  return autograd::pseudo_connect(pending, output);
}

}  // namespace cohort::train
