#pragma once

// A deterministic synthetic classification dataset for tests and examples: no files, no global
// RNG state (safe to call from several rank threads at once).

#include <cstdint>
#include <vector>

#include "worker/train/tensor_dataset.h"

namespace cohort::train {

struct SyntheticDatasetOptions {
  int64_t size = 256;                               // number of samples
  std::vector<int64_t> sample_shape = {1, 28, 28};  // shape of one input
  int64_t num_classes = 10;                         // labels in [0, num_classes)
  uint64_t seed = 0;                                // same seed → same dataset
};

// Inputs: float in [0, 1), each class a different mean so a model can learn it; targets: int64
// labels (sample i has label i % num_classes, so every class is present). Never fails for
// non-negative sizes; throws std::invalid_argument otherwise.
TensorDataset make_synthetic_dataset(const SyntheticDatasetOptions& options = {});

}  // namespace cohort::train
