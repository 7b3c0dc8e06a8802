#pragma once

// The C++ client of a cohort cluster, over the gRPC stubs. The CLI and schedulers use it.

#include <chrono>
#include <memory>
#include <string>

#include "cohort/v1/info.grpc.pb.h"
#include "worker/base/status.h"

namespace cohort::client {

// Deadline for a single unary RPC unless a call says otherwise.
inline constexpr std::chrono::seconds kDefaultRpcTimeout{10};

// The coordinator address: $COHORT_COORDINATOR, else 127.0.0.1:7070.
std::string default_coordinator_address();

class Client {
 public:
  // Does not connect yet; the first RPC does. Thread-safe.
  explicit Client(const std::string& address);

  // The daemon's version and roles. Blocks up to kDefaultRpcTimeout.
  StatusOr<cohort::v1::VersionInfo> server_version();

 private:
  std::string address_;
  std::unique_ptr<cohort::v1::Info::Stub> info_;
};

}  // namespace cohort::client
