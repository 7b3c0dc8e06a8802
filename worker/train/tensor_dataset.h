#pragma once

// TensorDataset: the in-memory dataset every part of worker/train passes around (Chainer's
// TupleDataset of two arrays): `inputs` and `targets` share their first dimension, sample i is
// (inputs[i], targets[i]). Tensors live on the CPU.

#include <cstdint>

#include <ATen/ATen.h>

namespace cohort::train {

struct TensorDataset {
  at::Tensor inputs;   // [N, ...] (images: N×1×28×28 float in [0, 1])
  at::Tensor targets;  // [N, ...] (labels: N int64)

  // Number of samples (0 for an empty dataset).
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }

  // The samples at `indices` (a 1-D int64 tensor; repeats allowed), copied, in that order.
  TensorDataset select(const at::Tensor& indices) const {
    return TensorDataset{inputs.index_select(0, indices), targets.index_select(0, indices)};
  }
  // Samples [begin, end) as views (no copy).
  TensorDataset slice(int64_t begin, int64_t end) const {
    return TensorDataset{inputs.slice(0, begin, end), targets.slice(0, begin, end)};
  }
};

}  // namespace cohort::train
