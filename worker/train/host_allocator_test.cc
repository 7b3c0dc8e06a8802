#include "worker/train/host_allocator.h"

#include <malloc.h>
#include <stdlib.h>

#include <cstring>

#include <gtest/gtest.h>

namespace cohort::train {
namespace {

// Bytes glibc holds in blocks mapped on their own (mmap), as opposed to the heap.
size_t mapped_bytes() { return mallinfo2().hblkhd; }

// Keeps the compiler from eliding a malloc/free pair.
void* volatile sink = nullptr;

TEST(HostAllocatorTest, EnvironmentChoiceWins) {
  ASSERT_EQ(setenv("COHORT_HOST_ALLOCATOR", "default", 1), 0);
  EXPECT_FALSE(tune_host_allocator());
  ASSERT_EQ(unsetenv("COHORT_HOST_ALLOCATOR"), 0);
  ASSERT_EQ(setenv("MALLOC_TRIM_THRESHOLD_", "1000000", 1), 0);
  EXPECT_FALSE(tune_host_allocator());
  ASSERT_EQ(unsetenv("MALLOC_TRIM_THRESHOLD_"), 0);
}

TEST(HostAllocatorTest, StepSizedBlocksComeFromTheHeapAndHugeOnesAreMapped) {
  ASSERT_TRUE(tune_host_allocator());
  // A 6 MB block (a conv activation of a batch-64 step) is above glibc's initial mmap threshold:
  // after tuning it comes from the heap and stays there for the next step.
  size_t before = mapped_bytes();
  void* step = malloc(size_t{6} << 20);
  ASSERT_NE(step, nullptr);
  sink = step;
  std::memset(step, 1, size_t{6} << 20);
  EXPECT_EQ(mapped_bytes(), before);
  struct mallinfo2 held = mallinfo2();
  free(step);
  // Freed at the top of the heap but below the trim threshold: kept, not returned.
  EXPECT_GE(mallinfo2().arena, held.arena);
  // A block above kHostMmapThresholdBytes is still mapped on its own (and unmapped when freed).
  void* huge = malloc(kHostMmapThresholdBytes * 2);
  ASSERT_NE(huge, nullptr);
  sink = huge;
  EXPECT_GE(mapped_bytes(), before + kHostMmapThresholdBytes * 2);
  free(huge);
  EXPECT_EQ(mapped_bytes(), before);
}

}  // namespace
}  // namespace cohort::train
