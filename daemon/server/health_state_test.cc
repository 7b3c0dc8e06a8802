#include "daemon/server/health_state.h"

#include <map>
#include <string>

#include <gtest/gtest.h>

namespace cohort::daemon {
namespace {

// Records what HealthState publishes, as gRPC's default health service would answer it.
class RecordingHealth : public grpc::HealthCheckServiceInterface {
 public:
  void SetServingStatus(const std::string& service, bool serving) override { status[service] = serving; }
  void SetServingStatus(bool serving) override {
    for (auto& [service, value] : status) value = serving;
  }
  std::map<std::string, bool> status;
};

constexpr const char* kCoordinator = "cohort.v1.Coordinator";
constexpr const char* kAgent = "cohort.v1.Agent";

TEST(HealthStateTest, NotServingUntilUpThenEveryService) {
  RecordingHealth health;
  HealthState state(&health, {kCoordinator, kAgent});
  EXPECT_EQ(health.status, (std::map<std::string, bool>{{"", false}, {kCoordinator, false}, {kAgent, false}}));
  EXPECT_FALSE(state.serving(""));
  state.set_up();
  EXPECT_EQ(health.status, (std::map<std::string, bool>{{"", true}, {kCoordinator, true}, {kAgent, true}}));
  EXPECT_TRUE(state.serving(kCoordinator));
  EXPECT_FALSE(state.serving("cohort.v1.Nothing"));
}

TEST(HealthStateTest, OneServiceOffTakesTheWholeDaemonOffButNotTheOthers) {
  RecordingHealth health;
  HealthState state(&health, {kCoordinator, kAgent});
  state.set_up();
  ASSERT_TRUE(state.set_serving(kCoordinator, false).ok());  // e.g. a standby coordinator
  EXPECT_FALSE(health.status[kCoordinator]);
  EXPECT_TRUE(health.status[kAgent]);
  EXPECT_FALSE(health.status[""]);
  EXPECT_FALSE(state.serving(""));
  ASSERT_TRUE(state.set_serving(kCoordinator, true).ok());
  EXPECT_TRUE(health.status[kCoordinator]);
  EXPECT_TRUE(health.status[""]);
}

TEST(HealthStateTest, DrainingWinsOverSetServing) {
  RecordingHealth health;
  HealthState state(&health, {kCoordinator, kAgent});
  state.set_up();
  state.set_draining();
  EXPECT_EQ(health.status, (std::map<std::string, bool>{{"", false}, {kCoordinator, false}, {kAgent, false}}));
  ASSERT_TRUE(state.set_serving(kAgent, true).ok());
  EXPECT_FALSE(health.status[kAgent]);
  EXPECT_FALSE(state.serving(kAgent));
}

TEST(HealthStateTest, UnknownServiceIsNotFoundNamingTheServed) {
  RecordingHealth health;
  HealthState state(&health, {kCoordinator});
  Status status = state.set_serving("cohort.v1.Agent", false);
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_NE(status.message().find("cohort.v1.Coordinator"), std::string::npos) << status.message();
  EXPECT_EQ(state.set_serving("", false).code(), StatusCode::kNotFound);  // "" follows the others
}

TEST(HealthStateTest, WithoutAHealthServiceKeepsTheState) {
  HealthState state(nullptr, {kCoordinator});
  state.set_up();
  EXPECT_TRUE(state.serving(""));
  ASSERT_TRUE(state.set_serving(kCoordinator, false).ok());
  EXPECT_FALSE(state.serving(kCoordinator));
}

}  // namespace
}  // namespace cohort::daemon
