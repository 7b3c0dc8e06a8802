#pragma once

// BinomialTree: the tree shared by BroadcastBinomial and ReduceBinomial. Ranks are renumbered
// relative to the root (v = (rank - root) mod P); v's parent is v with its lowest set bit
// cleared, and its children are v + 2^j for every 2^j below that bit (v + 2^j < P). The root
// (v = 0) has ceil(log2 P) children; depth is ceil(log2 P).

#include <vector>

namespace cohort::comm {

class BinomialTree {
 public:
  BinomialTree(int rank, int size, int root);

  // Real rank of the parent; -1 at the root.
  int parent() const { return parent_; }
  // Real ranks of the children, largest subtree first (the order a broadcast sends in; a
  // reduce receives in the reverse order, smallest subtree first, as those finish first).
  const std::vector<int>& children() const { return children_; }

 private:
  int parent_ = -1;
  std::vector<int> children_;
};

}  // namespace cohort::comm
