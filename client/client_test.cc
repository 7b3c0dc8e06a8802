#include "client/client.h"

#include <cstdlib>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "daemon/service/info_service.h"

namespace cohort::client {
namespace {

TEST(ClientTest, ReadsTheDaemonVersion) {
  cohort::daemon::InfoService service({"agent"});
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  Client client("127.0.0.1:" + std::to_string(port));
  auto info = client.server_version();
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->component(), "cohortd");
  server->Shutdown();
}

TEST(ClientTest, UnreachableDaemonNamesTheAddressAndWhatToDo) {
  // Bind and close a port so nothing listens there.
  int port = 0;
  {
    cohort::daemon::InfoService service({});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    builder.BuildAndStart()->Shutdown();
  }
  std::string address = "127.0.0.1:" + std::to_string(port);
  Client client(address);
  auto info = client.server_version();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(info.status().message().find(address), std::string::npos);
  EXPECT_NE(info.status().message().find("COHORT_COORDINATOR"), std::string::npos);
}

TEST(ClientTest, CoordinatorAddressDefaultsAndEnvironmentOverride) {
  unsetenv("COHORT_COORDINATOR");
  EXPECT_EQ(default_coordinator_address(), "127.0.0.1:7070");
  setenv("COHORT_COORDINATOR", "10.0.0.5:9000", 1);
  EXPECT_EQ(default_coordinator_address(), "10.0.0.5:9000");
  unsetenv("COHORT_COORDINATOR");
}

}  // namespace
}  // namespace cohort::client
