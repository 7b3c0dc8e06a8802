#pragma once

// Deterministic per-rank inputs and upstream gradients for the autograd gradient tests (thread and
// process level alike), so every rank can also compute every other rank's values for the
// single-process reference.

#include <ATen/ATen.h>

namespace cohort::autograd::testing {

inline int64_t numel_of(at::IntArrayRef shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Distinct values per rank and element.
inline at::Tensor data(int rank, at::IntArrayRef shape) {
  return at::arange(numel_of(shape), at::kDouble)
      .mul(0.37 * (rank + 1))
      .add(0.5 * rank)
      .sin()
      .mul(2)
      .add(0.1 * rank)
      .reshape(shape);
}

// Non-uniform upstream gradient dL/dy of `rank` (uniform gradients hide routing bugs).
inline at::Tensor upstream(int rank, at::IntArrayRef shape) {
  return at::arange(numel_of(shape), at::kDouble).mul(0.61 + 0.2 * rank).cos().add(rank + 0.5).reshape(shape);
}

}  // namespace cohort::autograd::testing
