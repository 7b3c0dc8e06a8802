#include "worker/train/synthetic_dataset.h"

#include <stdexcept>
#include <string>

#include <ATen/CPUGeneratorImpl.h>

namespace cohort::train {

TensorDataset make_synthetic_dataset(const SyntheticDatasetOptions& options) {
  if (options.size < 0 || options.num_classes <= 0) {
    throw std::invalid_argument("make_synthetic_dataset: size must be >= 0 and num_classes > 0, got size " +
                                std::to_string(options.size) + ", num_classes " +
                                std::to_string(options.num_classes));
  }
  // A private generator: the global one is shared by every thread of the process.
  at::Generator gen = at::detail::createCPUGenerator(options.seed);
  std::vector<int64_t> shape = {options.size};
  shape.insert(shape.end(), options.sample_shape.begin(), options.sample_shape.end());
  at::Tensor targets = at::arange(options.size, at::kLong).remainder(options.num_classes);
  at::Tensor noise = at::rand(shape, gen, at::kFloat);
  // Class c shifts its samples toward (c + 0.5) / num_classes: learnable, still in [0, 1).
  std::vector<int64_t> view_shape(shape.size(), 1);
  view_shape[0] = options.size;
  at::Tensor center = (targets.to(at::kFloat) + 0.5) / static_cast<double>(options.num_classes);
  at::Tensor inputs = 0.5 * noise + 0.5 * center.view(view_shape);
  return TensorDataset{inputs.contiguous(), targets};
}

}  // namespace cohort::train
