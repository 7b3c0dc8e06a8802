#include "daemon/server/server_limits.h"

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "daemon/service/info_service.h"

namespace cohort::daemon {
namespace {

using std::chrono::milliseconds;

TEST(ServerLimitsTest, ClientTimeoutsAreClamped) {
  EXPECT_EQ(clamp_client_timeout(milliseconds(1500)), milliseconds(1500));
  EXPECT_EQ(clamp_client_timeout(milliseconds(-5)), milliseconds(0));
  EXPECT_EQ(clamp_client_timeout(std::chrono::hours(24 * 365)), kMaxClientTimeout);
  EXPECT_EQ(clamp_client_timeout(milliseconds::max()), kMaxClientTimeout);
}

// A server built with the limits answers ordinary calls and refuses a message over the receive cap
// before any handler sees it.
TEST(ServerLimitsTest, OversizedMessagesAreRefused) {
  InfoService info({"coordinator"});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&info);
  apply_server_limits(builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  auto call = [&](const std::string& payload) {
    grpc::Slice slice(payload);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status result;
    bool done = false;
    std::mutex mu;
    std::condition_variable cv;
    stub.UnaryCall(&context, "/cohort.v1.Info/GetVersion", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status status) {
                     std::lock_guard<std::mutex> lock(mu);
                     result = std::move(status);
                     done = true;
                     cv.notify_all();
                   });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return result;
  };
  grpc::Status small = call("");
  EXPECT_TRUE(small.ok()) << small.error_message();
  // A length-delimited field 15 (unknown to GetVersionRequest) holding more than the cap.
  std::string big(static_cast<size_t>(kMaxReceiveMessageBytes) + 1024, 'x');
  grpc::Status refused = call(big);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

}  // namespace
}  // namespace cohort::daemon
