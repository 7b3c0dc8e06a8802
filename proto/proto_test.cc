#include <string>

#include <gtest/gtest.h>

#include "cohort/v1/info.pb.h"

namespace {

TEST(ProtoTest, VersionInfoRoundTripsThroughTheWireFormat) {
  cohort::v1::VersionInfo info;
  info.set_component("cohortd");
  info.set_version("1.2.3");
  info.add_roles("coordinator");
  std::string wire;
  ASSERT_TRUE(info.SerializeToString(&wire));
  cohort::v1::VersionInfo parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.component(), "cohortd");
  EXPECT_EQ(parsed.version(), "1.2.3");
  ASSERT_EQ(parsed.roles_size(), 1);
  EXPECT_EQ(parsed.roles(0), "coordinator");
}

}  // namespace
