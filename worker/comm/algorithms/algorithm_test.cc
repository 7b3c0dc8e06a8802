// Algorithm names and parsing, which algorithm implements which collective, the selector's
// size rules and overrides, and the shared arithmetic (chunking, binomial tree, fold).

#include <cstdlib>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "worker/comm/algorithms/algorithm.h"
#include "worker/comm/algorithms/algorithm_selector.h"
#include "worker/comm/algorithms/binomial_tree.h"
#include "worker/comm/algorithms/chunking.h"
#include "worker/comm/algorithms/power_of_two_fold.h"

namespace cohort::comm {
namespace {

TEST(AlgorithmTest, NamesRoundTripThroughTheParser) {
  for (int i = 0; i < kNumAlgorithms; ++i) {
    const auto algorithm = static_cast<Algorithm>(i);
    auto parsed = parse_algorithm(algorithm_name(algorithm));
    ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
    EXPECT_EQ(*parsed, algorithm);
  }
}

TEST(AlgorithmTest, ParsesAliases) {
  EXPECT_EQ(*parse_algorithm("rhd"), Algorithm::kHalvingDoubling);
  EXPECT_EQ(*parse_algorithm("halving_doubling"), Algorithm::kHalvingDoubling);
  EXPECT_EQ(*parse_algorithm("Halving-Doubling"), Algorithm::kHalvingDoubling);
  EXPECT_EQ(*parse_algorithm("recursive_doubling"), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(*parse_algorithm("binomial"), Algorithm::kBinomialTree);
  EXPECT_EQ(*parse_algorithm("RING"), Algorithm::kRing);
  EXPECT_EQ(*parse_algorithm("pairwise"), Algorithm::kPairwise);
  EXPECT_EQ(*parse_algorithm("linear"), Algorithm::kLinear);
  EXPECT_EQ(*parse_algorithm("auto"), Algorithm::kAuto);
  auto bad = parse_algorithm("butterfly");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'butterfly'"), std::string::npos);
}

TEST(AlgorithmTest, ImplementsMatrix) {
  EXPECT_TRUE(implements(Collective::kAllreduce, Algorithm::kRing));
  EXPECT_TRUE(implements(Collective::kAllreduce, Algorithm::kHalvingDoubling));
  EXPECT_TRUE(implements(Collective::kAllreduce, Algorithm::kRecursiveDoubling));
  EXPECT_TRUE(implements(Collective::kAllreduce, Algorithm::kLinear));
  EXPECT_FALSE(implements(Collective::kAllreduce, Algorithm::kPairwise));
  EXPECT_FALSE(implements(Collective::kBroadcast, Algorithm::kRing));
  EXPECT_TRUE(implements(Collective::kBroadcast, Algorithm::kBinomialTree));
  EXPECT_TRUE(implements(Collective::kReduce, Algorithm::kLinear));
  EXPECT_TRUE(implements(Collective::kAllgather, Algorithm::kRing));
  EXPECT_TRUE(implements(Collective::kReduceScatter, Algorithm::kRing));
  EXPECT_TRUE(implements(Collective::kAlltoall, Algorithm::kPairwise));
  EXPECT_FALSE(implements(Collective::kAlltoall, Algorithm::kRing));
  EXPECT_TRUE(implements(Collective::kGather, Algorithm::kLinear));
  EXPECT_TRUE(implements(Collective::kScatter, Algorithm::kLinear));
  for (int c = 0; c <= static_cast<int>(Collective::kBarrier); ++c) {
    EXPECT_TRUE(implements(static_cast<Collective>(c), Algorithm::kAuto));
  }
  Status status = check_implements(Collective::kAlltoall, Algorithm::kHalvingDoubling);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "alltoall has no 'halving_doubling' algorithm (available: pairwise)");
}

class AlgorithmSelectorTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv(kAlgorithmEnvironmentVariable); }
  void TearDown() override { unsetenv(kAlgorithmEnvironmentVariable); }
  AlgorithmSelector selector_;
};

TEST_F(AlgorithmSelectorTest, AllreduceBySizeAndRankCount) {
  const auto& options = selector_.options();
  for (int ranks : {2, 4, 8}) {
    EXPECT_EQ(selector_.by_size(Collective::kAllreduce, 8, ranks), Algorithm::kRecursiveDoubling);
    EXPECT_EQ(
        selector_.by_size(Collective::kAllreduce, options.allreduce_recursive_doubling_max_bytes, ranks),
        Algorithm::kRecursiveDoubling);
    EXPECT_EQ(
        selector_.by_size(Collective::kAllreduce, options.allreduce_recursive_doubling_max_bytes + 1, ranks),
        Algorithm::kHalvingDoubling);
    EXPECT_EQ(selector_.by_size(Collective::kAllreduce, options.allreduce_halving_doubling_max_bytes, ranks),
              Algorithm::kHalvingDoubling);
    EXPECT_EQ(
        selector_.by_size(Collective::kAllreduce, options.allreduce_halving_doubling_max_bytes + 1, ranks),
        Algorithm::kRing);
    EXPECT_EQ(selector_.by_size(Collective::kAllreduce, size_t{64} << 20, ranks), Algorithm::kRing);
  }
  for (int ranks : {3, 5, 6}) {
    EXPECT_EQ(selector_.by_size(Collective::kAllreduce, 64 * 1024, ranks), Algorithm::kHalvingDoubling);
    EXPECT_EQ(selector_.by_size(Collective::kAllreduce,
                                options.allreduce_folded_halving_doubling_max_bytes + 1, ranks),
              Algorithm::kRing);
  }
}

TEST_F(AlgorithmSelectorTest, OtherCollectivesHaveOneDefault) {
  EXPECT_EQ(selector_.by_size(Collective::kBroadcast, 1 << 20, 4), Algorithm::kBinomialTree);
  EXPECT_EQ(selector_.by_size(Collective::kReduce, 8, 4), Algorithm::kBinomialTree);
  EXPECT_EQ(selector_.by_size(Collective::kAllgather, 8, 4), Algorithm::kRing);
  EXPECT_EQ(selector_.by_size(Collective::kReduceScatter, 8, 4), Algorithm::kRing);
  EXPECT_EQ(selector_.by_size(Collective::kAlltoall, 8, 4), Algorithm::kPairwise);
  EXPECT_EQ(selector_.by_size(Collective::kGather, 8, 4), Algorithm::kLinear);
  EXPECT_EQ(selector_.by_size(Collective::kScatter, 8, 4), Algorithm::kLinear);
}

TEST_F(AlgorithmSelectorTest, ForcedAlgorithmWinsOrFails) {
  EXPECT_EQ(*selector_.select(Collective::kAllreduce, 8, 4, Algorithm::kRing), Algorithm::kRing);
  EXPECT_EQ(*selector_.select(Collective::kAllreduce, size_t{1} << 30, 4, Algorithm::kLinear),
            Algorithm::kLinear);
  auto refused = selector_.select(Collective::kBroadcast, 8, 4, Algorithm::kPairwise);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(AlgorithmSelectorTest, ReadingTheEnvironmentOnceKeepsTheValueAtConstruction) {
  setenv(kAlgorithmEnvironmentVariable, "ring", 1);
  AlgorithmSelectorOptions options;
  options.read_environment_once = true;
  AlgorithmSelector cached(options);
  unsetenv(kAlgorithmEnvironmentVariable);
  EXPECT_EQ(*cached.select(Collective::kAllreduce, 8, 4), Algorithm::kRing);
  // The default selector reads it on every call.
  EXPECT_EQ(*selector_.select(Collective::kAllreduce, 8, 4), Algorithm::kRecursiveDoubling);
}

TEST_F(AlgorithmSelectorTest, EnvironmentOverridesAutoWhereItApplies) {
  setenv(kAlgorithmEnvironmentVariable, "ring", 1);
  EXPECT_EQ(*selector_.select(Collective::kAllreduce, 8, 4), Algorithm::kRing);
  EXPECT_EQ(*selector_.select(Collective::kAllgather, 8, 4), Algorithm::kRing);
  // Broadcast has no ring: the environment is a process-wide hint, not an error.
  EXPECT_EQ(*selector_.select(Collective::kBroadcast, 8, 4), Algorithm::kBinomialTree);
  // A forced algorithm beats the environment.
  EXPECT_EQ(*selector_.select(Collective::kAllreduce, 8, 4, Algorithm::kLinear), Algorithm::kLinear);
  setenv(kAlgorithmEnvironmentVariable, "rhd", 1);
  EXPECT_EQ(*selector_.select(Collective::kAllreduce, size_t{64} << 20, 4), Algorithm::kHalvingDoubling);
  setenv(kAlgorithmEnvironmentVariable, "auto", 1);
  EXPECT_EQ(*selector_.select(Collective::kAllreduce, 8, 4), Algorithm::kRecursiveDoubling);
  setenv(kAlgorithmEnvironmentVariable, "fastest", 1);
  auto bad = selector_.select(Collective::kAllreduce, 8, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("COHORT_ALGO"), std::string::npos) << bad.status().message();
  // A selector told to ignore the environment does.
  AlgorithmSelectorOptions options;
  options.environment_variable = "";
  EXPECT_EQ(*AlgorithmSelector(options).select(Collective::kAllreduce, 8, 4), Algorithm::kRecursiveDoubling);
}

TEST(ChunkingTest, EvenBlocksCoverTheBufferInOrder) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, (size_t{1} << 20) + 3}) {
    for (int parts : {1, 2, 3, 5, 8}) {
      size_t next = 0;
      for (int i = 0; i < parts; ++i) {
        const Span block = even_block(count, parts, i);
        EXPECT_EQ(block.offset, next);
        EXPECT_LE(block.size, count / parts + 1);
        EXPECT_GE(block.size, count / parts);
        next += block.size;
      }
      EXPECT_EQ(next, count);
    }
  }
  EXPECT_EQ(prefix_offsets({3, 0, 5}), (std::vector<size_t>{0, 3, 3}));
}

TEST(ChunkingTest, SegmentsAreBoundedAlignedAndCoverTheBlock) {
  for (size_t bytes :
       {size_t{1}, size_t{64}, size_t{1000}, size_t{100000}, size_t{3} << 20, size_t{64} << 20}) {
    const size_t segment = segment_bytes_for(bytes);
    EXPECT_EQ(segment % 64, 0u) << bytes;
    EXPECT_LE(segment, kMaxSegmentBytes);
    if (bytes >= kMinSegmentBytes) {
      EXPECT_GE(segment, kMinSegmentBytes) << bytes;
    }
    size_t covered = 0;
    for (size_t i = 0; i < segment_count(bytes, segment); ++i) {
      const Span span = segment_of(bytes, segment, i);
      EXPECT_EQ(span.offset, covered);
      EXPECT_GT(span.size, 0u);
      covered += span.size;
    }
    EXPECT_EQ(covered, bytes);
    EXPECT_EQ(segment_of(bytes, segment, segment_count(bytes, segment)).size, 0u);
  }
  EXPECT_EQ(segment_count(0, segment_bytes_for(0)), 0u);
}

TEST(BinomialTreeTest, EveryRankHasOneParentAndTheTreeSpansTheGroup) {
  for (int size : {1, 2, 3, 4, 5, 8, 13}) {
    for (int root = 0; root < size; ++root) {
      std::vector<int> parent_count(size, 0);
      for (int rank = 0; rank < size; ++rank) {
        const BinomialTree tree(rank, size, root);
        EXPECT_EQ(tree.parent() < 0, rank == root);
        for (int child : tree.children()) {
          ++parent_count[child];
          EXPECT_EQ(BinomialTree(child, size, root).parent(), rank);
        }
      }
      for (int rank = 0; rank < size; ++rank) EXPECT_EQ(parent_count[rank], rank == root ? 0 : 1);
    }
  }
  // Root 0 of 8: children largest subtree first.
  EXPECT_EQ(BinomialTree(0, 8, 0).children(), (std::vector<int>{4, 2, 1}));
  EXPECT_EQ(BinomialTree(2, 5, 3).parent(), 3);  // relative rank 4's parent is relative 0: the root
}

TEST(PowerOfTwoFoldTest, VirtualRanksAreABijectionOntoThePowerOfTwo) {
  for (int size : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12}) {
    std::set<int> virtual_ranks;
    int virtual_size = 0;
    for (int rank = 0; rank < size; ++rank) {
      const PowerOfTwoFold fold(rank, size);
      virtual_size = fold.virtual_size();
      EXPECT_EQ(virtual_size & (virtual_size - 1), 0);
      EXPECT_LE(virtual_size, size);
      EXPECT_GT(virtual_size * 2, size);
      if (fold.participates()) {
        virtual_ranks.insert(fold.virtual_rank());
        EXPECT_EQ(fold.real_rank(fold.virtual_rank()), rank);
      }
    }
    EXPECT_EQ(static_cast<int>(virtual_ranks.size()), virtual_size);
  }
}

}  // namespace
}  // namespace cohort::comm
