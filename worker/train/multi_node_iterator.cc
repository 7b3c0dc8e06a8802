#include "worker/train/multi_node_iterator.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "worker/autograd/tensor_comm.h"
#include "worker/train/scatter_dataset.h"

namespace cohort::train {
namespace {

// Iterators run on the training thread: collectives run there.
const comm::CallOptions kBlocking{std::nullopt, true};

// The meta string of a batch that ends the epoch (encode_meta never yields it).
constexpr char kEndOfEpoch[] = "end";

bool is_host_or_cuda(const at::Tensor& t) { return t.device().is_cpu() || t.device().is_cuda(); }

Status broadcast_tensor(at::Tensor& tensor, comm::DataType dtype, comm::Communicator& comm, int root) {
  return comm.broadcast(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), dtype, root, kBlocking)
      ->wait();
}

}  // namespace

uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(epoch) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

BatchIterator::BatchIterator(TensorDataset dataset, int64_t batch_size, bool shuffle, uint64_t seed)
    : dataset_(std::move(dataset)),
      batch_size_(std::max<int64_t>(batch_size, 1)),
      shuffle_(shuffle),
      seed_(seed) {
  make_order();
}

void BatchIterator::make_order() {
  order_ = scatter_order(dataset_.size(), shuffle_, epoch_seed(seed_, position_.epoch));
}

std::optional<TensorDataset> BatchIterator::next() {
  if (at_end_) {
    at_end_ = false;
    ++position_.epoch;
    position_.offset = 0;
    make_order();
  }
  int64_t n = dataset_.size();
  if (position_.offset >= n) {
    at_end_ = true;
    return std::nullopt;
  }
  int64_t end = std::min(n, position_.offset + batch_size_);
  std::vector<int64_t> indices(order_.begin() + position_.offset, order_.begin() + end);
  position_.offset = end;
  return dataset_.select(at::tensor(indices, at::kLong));
}

void BatchIterator::set_position(const IteratorPosition& position) {
  position_ = position;
  at_end_ = false;
  make_order();
}

MultiNodeIterator::MultiNodeIterator(BatchSource source, comm::Communicator& comm, int root)
    : source_(std::move(source)), comm_(comm), root_(root) {}

StatusOr<std::optional<TensorDataset>> MultiNodeIterator::next() {
  if (root_ < 0 || root_ >= comm_.size()) {
    return invalid_argument_error("multi-node iterator: root {} is not a rank of {}", root_,
                                  comm_.description());
  }
  // Step 1: the root describes the batch ("end", or both tensors' meta, or an error text that
  // every rank returns), so the others can allocate.
  std::string meta;
  TensorDataset batch;     // what travels: host tensors
  TensorDataset returned;  // at the root: its batch on its own device(s)
  if (comm_.rank() == root_) {
    std::optional<TensorDataset> drawn = source_ ? source_() : std::nullopt;
    if (!drawn.has_value()) {
      meta = kEndOfEpoch;
    } else if (!drawn->inputs.defined() || !drawn->targets.defined() || !is_host_or_cuda(drawn->inputs) ||
               !is_host_or_cuda(drawn->targets)) {
      meta = "!the root's batch has undefined tensors or tensors on a device other than CPU and CUDA";
    } else {
      returned = TensorDataset{drawn->inputs.contiguous(), drawn->targets.contiguous()};
      // CUDA batches travel through host memory (a copy, which also waits for the kernels that
      // produced them); the root keeps its device tensors.
      batch = TensorDataset{returned.inputs.cpu(), returned.targets.cpu()};
      try {
        autograd::to_data_type(batch.inputs.scalar_type());
        autograd::to_data_type(batch.targets.scalar_type());
        meta = autograd::encode_meta(batch.inputs.scalar_type(), batch.inputs.sizes()) + "\n" +
               autograd::encode_meta(batch.targets.scalar_type(), batch.targets.sizes());
      } catch (const std::exception& e) {
        meta = std::string("!the root's batch: ") + e.what();
      }
    }
  }
  COHORT_ASSIGN_OR_RETURN(meta, comm_.bcast_obj(meta, root_));
  if (meta == kEndOfEpoch) return std::optional<TensorDataset>();
  if (!meta.empty() && meta[0] == '!')
    return invalid_argument_error("multi-node iterator: {}", meta.substr(1));
  // Step 2: the tensors themselves.
  try {
    size_t split = meta.find('\n');
    at::ScalarType input_type, target_type;
    std::vector<int64_t> input_shape, target_shape;
    autograd::decode_meta(meta.substr(0, split), &input_type, &input_shape);
    autograd::decode_meta(meta.substr(split + 1), &target_type, &target_shape);
    if (comm_.rank() != root_) {
      batch = TensorDataset{at::empty(input_shape, at::TensorOptions().dtype(input_type)),
                            at::empty(target_shape, at::TensorOptions().dtype(target_type))};
    }
    COHORT_RETURN_IF_ERROR(broadcast_tensor(batch.inputs, autograd::to_data_type(input_type), comm_, root_));
    COHORT_RETURN_IF_ERROR(
        broadcast_tensor(batch.targets, autograd::to_data_type(target_type), comm_, root_));
  } catch (const std::exception& e) {
    return internal_error("multi-node iterator: bad batch description '{}': {}", meta, e.what());
  }
  if (comm_.rank() == root_) batch = std::move(returned);
  return std::optional<TensorDataset>(std::move(batch));
}

std::unique_ptr<MultiNodeIterator> create_multi_node_iterator(MultiNodeIterator::BatchSource source,
                                                              comm::Communicator& comm, int root) {
  return std::make_unique<MultiNodeIterator>(std::move(source), comm, root);
}

std::unique_ptr<MultiNodeIterator> create_multi_node_iterator(const TensorDataset& dataset,
                                                              int64_t batch_size, comm::Communicator& comm,
                                                              int root, bool shuffle, uint64_t seed) {
  MultiNodeIterator::BatchSource source;
  if (comm.rank() == root) {
    auto local = std::make_shared<BatchIterator>(dataset, batch_size, shuffle, seed);
    source = [local] { return local->next(); };
  }
  return std::make_unique<MultiNodeIterator>(std::move(source), comm, root);
}

StatusOr<std::unique_ptr<BatchIterator>> create_synchronized_iterator(TensorDataset dataset,
                                                                      int64_t batch_size,
                                                                      comm::Communicator& comm, uint64_t seed,
                                                                      int root) {
  if (root < 0 || root >= comm.size()) {
    return invalid_argument_error("create_synchronized_iterator: root {} is not a rank of {}", root,
                                  comm.description());
  }
  uint64_t shared = seed;
  COHORT_RETURN_IF_ERROR(comm.broadcast(&shared, 1, comm::DataType::kInt64, root, kBlocking)->wait());
  return std::make_unique<BatchIterator>(std::move(dataset), batch_size, true, shared);
}

}  // namespace cohort::train
