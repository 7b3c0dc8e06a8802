#include "worker/comm/algorithms/binomial_tree.h"

namespace cohort::comm {

BinomialTree::BinomialTree(int rank, int size, int root) {
  const int relative = (rank - root + size) % size;
  auto real = [&](int v) { return (v + root) % size; };
  int mask = 1;
  while (mask < size && (relative & mask) == 0) mask *= 2;
  if (relative != 0) parent_ = real(relative - mask);
  // For the root the loop ran past the group: children at every power of two below it.
  for (mask /= 2; mask >= 1; mask /= 2) {
    if (relative + mask < size) children_.push_back(real(relative + mask));
  }
}

}  // namespace cohort::comm
