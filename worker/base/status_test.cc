#include "worker/base/status.h"

#include <memory>

#include <gtest/gtest.h>

namespace cohort {
namespace {

StatusOr<int> parse_positive(int value) {
  if (value <= 0) return invalid_argument_error("value {} is not positive", value);
  return value;
}

Status doubled(int value, int* out) {
  COHORT_ASSIGN_OR_RETURN(int checked, parse_positive(value));
  *out = checked * 2;
  return ok_status();
}

TEST(StatusTest, FactoriesCarryCodeAndFormattedMessage) {
  Status status = deadline_exceeded_error("allreduce waited {} ms on rank {}", 250, 3);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(status.to_string(), "DEADLINE_EXCEEDED: allreduce waited 250 ms on rank 3");
  EXPECT_EQ(status.with_context("step 7").message(), "step 7: allreduce waited 250 ms on rank 3");
  EXPECT_TRUE(ok_status().with_context("ignored").ok());
}

TEST(StatusTest, AssignOrReturnPropagatesErrors) {
  int out = 0;
  EXPECT_TRUE(doubled(21, &out).ok());
  EXPECT_EQ(out, 42);
  Status bad = doubled(-1, &out);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "value -1 is not positive");
}

TEST(StatusTest, StatusOrHoldsMoveOnlyValues) {
  StatusOr<std::unique_ptr<int>> holder(std::make_unique<int>(5));
  ASSERT_TRUE(holder.ok());
  std::unique_ptr<int> taken = std::move(holder).value();
  EXPECT_EQ(*taken, 5);
}

TEST(StatusTest, StatusOrFromOkStatusIsAnError) {
  StatusOr<int> wrong{ok_status()};
  EXPECT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInternal);
}

TEST(StatusTest, ErrnoMapsToCodes) {
  EXPECT_EQ(errno_status("open(/x)", ENOENT).code(), StatusCode::kNotFound);
  EXPECT_EQ(errno_status("connect", ECONNREFUSED).code(), StatusCode::kUnavailable);
  EXPECT_NE(errno_status("open(/x)", ENOENT).message().find("open(/x)"), std::string::npos);
}

TEST(StatusDeathTest, ValueOfErrorAbortsWithTheMessage) {
  StatusOr<int> bad = not_found_error("no key 'x'");
  EXPECT_DEATH({ (void)bad.value(); }, "no key 'x'");
}

}  // namespace
}  // namespace cohort
