#include "worker/train/scatter_dataset.h"

#include <algorithm>
#include <exception>
#include <random>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "worker/autograd/tensor_comm.h"

namespace cohort::train {
namespace {

// Blocking calls: scattering happens once, before training, on the caller's thread.
const comm::CallOptions kBlocking{std::nullopt, true};

Status check_root(const comm::Communicator& comm, int root, const char* op) {
  if (root < 0 || root >= comm.size()) {
    return invalid_argument_error("{}: root {} is not a rank of {} (size {})", op, root, comm.description(),
                                  comm.size());
  }
  return ok_status();
}

// The root's sample count, known to every rank afterwards.
StatusOr<int64_t> agree_on_size(int64_t n, comm::Communicator& comm, int root, const char* op) {
  int64_t value = n;
  COHORT_RETURN_IF_ERROR(comm.broadcast(&value, 1, comm::DataType::kInt64, root, kBlocking)->wait());
  // Checked after the broadcast, so every rank fails together instead of waiting for the root.
  if (value < 0) return invalid_argument_error("{}: the root's dataset size {} is negative", op, value);
  return value;
}

// Each rank's share of positions, in rank order.
std::vector<size_t> share_counts(int64_t n, int size, bool force_equal_length) {
  std::vector<size_t> counts;
  for (int r = 0; r < size; ++r) {
    IndexRange range = scatter_range(n, size, r, force_equal_length);
    counts.push_back(static_cast<size_t>(range.end - range.begin));
  }
  return counts;
}

// At the root: every rank's indices, concatenated in rank order (the scatterv send buffer).
std::vector<int64_t> all_shares(int64_t n, int size, bool shuffle, uint64_t seed, bool force_equal_length) {
  std::vector<int64_t> order = scatter_order(n, shuffle, seed);
  std::vector<int64_t> out;
  for (int r = 0; r < size; ++r) {
    IndexRange range = scatter_range(n, size, r, force_equal_length);
    for (int64_t j = range.begin; j < range.end; ++j) out.push_back(order[j % n]);
  }
  return out;
}

StatusOr<comm::DataType> data_type_of(at::ScalarType type, const char* what) {
  try {
    return autograd::to_data_type(type);
  } catch (const std::exception& e) {
    return invalid_argument_error("scatter_dataset: {}: {}", what, e.what());
  }
}

// Scatters rows of `rows` (meaningful at the root: every rank's rows, concatenated in rank
// order) so each rank gets counts[rank] rows of shape `sample_shape` and type `type`.
StatusOr<at::Tensor> scatter_rows(const at::Tensor& rows, at::ScalarType type,
                                  const std::vector<int64_t>& sample_shape, const std::vector<size_t>& counts,
                                  comm::Communicator& comm, int root, const char* what) {
  COHORT_ASSIGN_OR_RETURN(comm::DataType dtype, data_type_of(type, what));
  int64_t per_sample = 1;
  for (int64_t d : sample_shape) per_sample *= d;
  std::vector<size_t> element_counts;
  for (size_t c : counts) element_counts.push_back(c * static_cast<size_t>(per_sample));
  std::vector<int64_t> shape = {static_cast<int64_t>(counts[comm.rank()])};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(type));
  const void* send = comm.rank() == root ? rows.data_ptr() : nullptr;
  COHORT_RETURN_IF_ERROR(comm.scatterv(send, element_counts, out.data_ptr(), dtype, root, kBlocking)->wait());
  return out;
}

// What the root's dataset holds, known to every rank afterwards: the dtype and per-sample shape
// of the inputs and the targets.
struct Layout {
  at::ScalarType input_type = at::kFloat, target_type = at::kLong;
  std::vector<int64_t> input_shape, target_shape;
};

// The root checks its dataset and sends either its layout or its error, so a bad root dataset
// fails every rank at once instead of leaving the others waiting for data. `root_error` is an
// error the root met before (reading a Dataset); it is sent instead of the layout.
StatusOr<Layout> agree_on_layout(const TensorDataset& dataset, const Status& root_error,
                                 comm::Communicator& comm, int root) {
  constexpr char kError = 'E', kOk = 'O';
  std::string message;
  if (comm.rank() == root) {
    const at::Tensor& x = dataset.inputs;
    const at::Tensor& y = dataset.targets;
    if (!root_error.ok()) {
      message = std::string(1, kError) + root_error.message();
    } else if (!x.defined() || !y.defined() || x.dim() < 1 || y.dim() < 1) {
      message =
          std::string(1, kError) + "the root's inputs and targets must be tensors of at least one dimension";
    } else if (x.size(0) != y.size(0)) {
      message =
          std::string(1, kError) +
          fmt::format("the root's inputs hold {} samples but its targets hold {}", x.size(0), y.size(0));
    } else {
      message = std::string(1, kOk) + autograd::encode_meta(x.scalar_type(), x.sizes().slice(1)) + "\n" +
                autograd::encode_meta(y.scalar_type(), y.sizes().slice(1));
    }
  }
  COHORT_ASSIGN_OR_RETURN(std::string agreed, comm.bcast_obj(message, root));
  if (agreed.empty() || agreed[0] != kOk) {
    return invalid_argument_error("scatter_dataset (root {}): {}", root,
                                  agreed.empty() ? "" : agreed.substr(1));
  }
  size_t newline = agreed.find('\n');
  Layout layout;
  autograd::decode_meta(agreed.substr(1, newline - 1), &layout.input_type, &layout.input_shape);
  autograd::decode_meta(agreed.substr(newline + 1), &layout.target_type, &layout.target_shape);
  return layout;
}

}  // namespace

IndexRange scatter_range(int64_t n, int size, int rank, bool force_equal_length) {
  int64_t begin = n * rank / size;
  int64_t end = force_equal_length ? begin + (n + size - 1) / size : n * (rank + 1) / size;
  if (n == 0) end = begin;  // nothing to repeat
  return IndexRange{begin, end};
}

std::vector<int64_t> scatter_order(int64_t n, bool shuffle, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (!shuffle) return order;
  // Fisher–Yates with our own bounded draw: std::shuffle and uniform_int_distribution are not
  // specified bit-for-bit, and every rank must agree with a root built elsewhere.
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    uint64_t bound = static_cast<uint64_t>(i) + 1;
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;  // rejection keeps the draw unbiased
    uint64_t draw = rng();
    while (draw >= limit) draw = rng();
    std::swap(order[i], order[draw % bound]);
  }
  return order;
}

uint64_t seed_or_fresh(const std::optional<uint64_t>& seed) {
  if (seed.has_value()) return *seed;
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

StatusOr<std::vector<int64_t>> scatter_index(int64_t n, comm::Communicator& comm, int root, bool shuffle,
                                             std::optional<uint64_t> seed, bool force_equal_length) {
  COHORT_RETURN_IF_ERROR(check_root(comm, root, "scatter_index"));
  COHORT_ASSIGN_OR_RETURN(int64_t total, agree_on_size(n, comm, root, "scatter_index"));
  std::vector<size_t> counts = share_counts(total, comm.size(), force_equal_length);
  std::vector<int64_t> shares;
  if (comm.rank() == root) {
    shares = all_shares(total, comm.size(), shuffle, seed_or_fresh(seed), force_equal_length);
  }
  std::vector<int64_t> mine(counts[comm.rank()]);
  COHORT_RETURN_IF_ERROR(
      comm.scatterv(shares.data(), counts, mine.data(), comm::DataType::kInt64, root, kBlocking)->wait());
  return mine;
}

namespace {

// What the root scatters: every rank's samples, stacked in rank order (`rows`, contiguous CPU
// tensors), the root's sample count, or the error that stopped the root from building them.
struct RootRows {
  Status error = ok_status();
  int64_t total = 0;
  TensorDataset rows;
};

// The common tail of both scatter_dataset overloads: every rank learns the layout (or the root's
// error) and the total, then receives its rows.
StatusOr<TensorDataset> scatter_root_rows(const RootRows& at_root, comm::Communicator& comm, int root,
                                          bool force_equal_length) {
  COHORT_ASSIGN_OR_RETURN(Layout layout, agree_on_layout(at_root.rows, at_root.error, comm, root));
  COHORT_ASSIGN_OR_RETURN(int64_t total, agree_on_size(at_root.total, comm, root, "scatter_dataset"));
  std::vector<size_t> counts = share_counts(total, comm.size(), force_equal_length);
  COHORT_ASSIGN_OR_RETURN(at::Tensor inputs, scatter_rows(at_root.rows.inputs, layout.input_type,
                                                          layout.input_shape, counts, comm, root, "inputs"));
  COHORT_ASSIGN_OR_RETURN(
      at::Tensor targets,
      scatter_rows(at_root.rows.targets, layout.target_type, layout.target_shape, counts, comm, root, "targets"));
  return TensorDataset{inputs, targets};
}

// Stacks dataset.get(i) for i in `indices`; every sample must have the first one's layout.
RootRows stack_samples(const Dataset& dataset, int64_t total, const std::vector<int64_t>& indices) {
  RootRows out;
  out.total = total;
  if (total == 0) {
    out.rows = TensorDataset{at::empty({0}), at::empty({0}, at::kLong)};
    return out;
  }
  std::vector<at::Tensor> inputs, targets;
  inputs.reserve(indices.size());
  targets.reserve(indices.size());
  for (int64_t i : indices) {
    Example example;
    try {
      example = dataset.get(i);
    } catch (const std::exception& e) {
      out.error = invalid_argument_error("the root's dataset failed to produce sample {}: {}", i, e.what());
      return out;
    }
    if (!example.input.defined() || !example.target.defined()) {
      out.error = invalid_argument_error("sample {} of the root's dataset has an undefined input or target", i);
      return out;
    }
    if (!inputs.empty()) {
      const at::Tensor& x0 = inputs.front();
      const at::Tensor& y0 = targets.front();
      if (example.input.scalar_type() != x0.scalar_type() || example.input.sizes() != x0.sizes() ||
          example.target.scalar_type() != y0.scalar_type() || example.target.sizes() != y0.sizes()) {
        out.error = invalid_argument_error(
            "sample {} of the root's dataset is ({}, {}) but sample {} is ({}, {}); every sample must have the "
            "same dtypes and shapes",
            i, autograd::encode_meta(example.input.scalar_type(), example.input.sizes()),
            autograd::encode_meta(example.target.scalar_type(), example.target.sizes()), indices.front(),
            autograd::encode_meta(x0.scalar_type(), x0.sizes()), autograd::encode_meta(y0.scalar_type(), y0.sizes()));
        return out;
      }
    }
    inputs.push_back(example.input.cpu());
    targets.push_back(example.target.cpu());
  }
  out.rows = TensorDataset{at::stack(inputs).contiguous(), at::stack(targets).contiguous()};
  return out;
}

}  // namespace

StatusOr<TensorDataset> scatter_dataset(const TensorDataset& dataset, comm::Communicator& comm, int root,
                                        bool shuffle, std::optional<uint64_t> seed, bool force_equal_length) {
  COHORT_RETURN_IF_ERROR(check_root(comm, root, "scatter_dataset"));
  RootRows at_root;
  if (comm.rank() == root) {
    at_root.total = dataset.size();
    at_root.rows = dataset;  // checked by agree_on_layout; replaced by the selected rows when valid
    const at::Tensor& x = dataset.inputs;
    const at::Tensor& y = dataset.targets;
    if (x.defined() && y.defined() && x.dim() >= 1 && y.dim() >= 1 && x.size(0) == y.size(0)) {
      std::vector<int64_t> shares =
          all_shares(at_root.total, comm.size(), shuffle, seed_or_fresh(seed), force_equal_length);
      // A dataset on a CUDA device is selected there and travels through host memory (.cpu() is
      // a no-op for a CPU dataset); every rank's shard is a CPU dataset.
      at::Tensor index = at::tensor(shares, at::kLong);
      auto rows_of = [&index](const at::Tensor& t) {
        return t.index_select(0, index.to(t.device())).contiguous().cpu();
      };
      at_root.rows = TensorDataset{rows_of(x), rows_of(y)};
    }
  }
  return scatter_root_rows(at_root, comm, root, force_equal_length);
}

StatusOr<TensorDataset> scatter_dataset(const Dataset* dataset, comm::Communicator& comm, int root,
                                        bool shuffle, std::optional<uint64_t> seed, bool force_equal_length) {
  COHORT_RETURN_IF_ERROR(check_root(comm, root, "scatter_dataset"));
  RootRows at_root;
  if (comm.rank() == root) {
    if (dataset == nullptr) {
      at_root.error = invalid_argument_error("the root passed no dataset (a null Dataset*)");
    } else if (dataset->size() < 0) {
      at_root.error = invalid_argument_error("the root's dataset size {} is negative", dataset->size());
    } else {
      int64_t total = dataset->size();
      at_root = stack_samples(
          *dataset, total, all_shares(total, comm.size(), shuffle, seed_or_fresh(seed), force_equal_length));
    }
  }
  return scatter_root_rows(at_root, comm, root, force_equal_length);
}

TensorDataset create_empty_dataset(const TensorDataset& like) {
  int64_t n = like.size();
  at::ScalarType input_type = like.inputs.defined() ? like.inputs.scalar_type() : at::kFloat;
  at::ScalarType target_type = like.targets.defined() ? like.targets.scalar_type() : at::kLong;
  return TensorDataset{at::empty({n, 0}, at::TensorOptions().dtype(input_type)),
                       at::empty({n, 0}, at::TensorOptions().dtype(target_type))};
}

TensorDataset create_empty_dataset(const Dataset& like) {
  int64_t n = std::max<int64_t>(like.size(), 0);
  return TensorDataset{at::empty({n, 0}), at::empty({n, 0}, at::kLong)};
}

}  // namespace cohort::train
