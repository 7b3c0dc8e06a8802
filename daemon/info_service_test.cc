#include <memory>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "daemon/service/info_service.h"
#include "worker/base/version.h"

namespace cohort::daemon {
namespace {

TEST(InfoServiceTest, AnswersVersionOverARealServerOnAnEphemeralPort) {
  InfoService service({"coordinator", "agent"});
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = cohort::v1::Info::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  cohort::v1::VersionInfo info;
  grpc::Status status = stub->GetVersion(&context, cohort::v1::GetVersionRequest(), &info);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(info.component(), "cohortd");
  EXPECT_EQ(info.version(), kVersion);
  ASSERT_EQ(info.roles_size(), 2);
  EXPECT_EQ(info.roles(1), "agent");
  server->Shutdown();
}

}  // namespace
}  // namespace cohort::daemon
