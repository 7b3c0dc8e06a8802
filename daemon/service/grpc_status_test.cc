#include "daemon/service/grpc_status.h"

#include <gtest/gtest.h>

namespace cohort::daemon {
namespace {

TEST(GrpcStatusTest, EveryCodeAndMessageRoundTrips) {
  for (int code = 0; code <= static_cast<int>(StatusCode::kUnauthenticated); ++code) {
    const Status original(static_cast<StatusCode>(code), code == 0 ? "" : "what failed, with which values");
    const grpc::Status wire = to_grpc_status(original);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(wire.error_message(), original.message());
    EXPECT_EQ(from_grpc_status(wire), original);
  }
}

TEST(GrpcStatusTest, UnknownWireCodesBecomeUnknownAndClientErrorsNameTheCall) {
  EXPECT_EQ(from_grpc_status(grpc::Status(static_cast<grpc::StatusCode>(99), "odd")).code(),
            StatusCode::kUnknown);
  const Status status = from_grpc_status(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused"),
                                         "Rendezvous.Join", "10.0.0.1:7070");
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(status.message(), "Rendezvous.Join to 10.0.0.1:7070: connection refused");
  EXPECT_TRUE(from_grpc_status(grpc::Status::OK, "Rendezvous.Join", "x").ok());
}

}  // namespace
}  // namespace cohort::daemon
