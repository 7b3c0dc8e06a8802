#pragma once

// Dataset: the small interface through which scatter_dataset and create_empty_dataset accept
// datasets other than an in-memory TensorDataset (Chainer's dataset protocol: __len__ and
// __getitem__). A dataset read lazily — files on disk, a generator, a transform over another
// dataset — implements size() and get(); only the root of scatter_dataset calls them.
//
//   class Images : public Dataset {
//    public:
//     int64_t size() const override { return paths_.size(); }
//     Example get(int64_t i) const override { return {read_image(paths_[i]), label_of(paths_[i])}; }
//   };
//   TensorDataset mine = scatter_dataset(images, *comm, /*root=*/0, /*shuffle=*/true).value();
//
// Or without a class: make_dataset(n, [](int64_t i) { return Example{...}; }).

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include <ATen/ATen.h>

namespace cohort::train {

// One sample: an input and its target (Chainer's (x, t) tuple). Every sample of a dataset that is
// scattered must have the same dtypes and shapes (they are stacked into a TensorDataset).
struct Example {
  at::Tensor input;
  at::Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Number of samples. Called once per scatter, at the root.
  virtual int64_t size() const = 0;
  // Sample `index`, 0 <= index < size(). Called at the root for each sample a rank receives (a
  // sample may be asked for more than once with force_equal_length). May throw; scatter_dataset
  // turns the exception into an error on every rank.
  virtual Example get(int64_t index) const = 0;
};

// A Dataset of `size` samples produced by `get(index)` (copied into the dataset).
class FunctionDataset : public Dataset {
 public:
  FunctionDataset(int64_t size, std::function<Example(int64_t)> get) : size_(size), get_(std::move(get)) {}
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override { return get_(index); }

 private:
  int64_t size_;
  std::function<Example(int64_t)> get_;
};

inline std::unique_ptr<Dataset> make_dataset(int64_t size, std::function<Example(int64_t)> get) {
  return std::make_unique<FunctionDataset>(size, std::move(get));
}

}  // namespace cohort::train
