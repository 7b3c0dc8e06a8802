#include "client/client.h"

#include <cstdlib>

#include <grpcpp/grpcpp.h>

namespace cohort::client {

std::string default_coordinator_address() {
  const char* env = std::getenv("COHORT_COORDINATOR");
  return env != nullptr && *env != '\0' ? env : "127.0.0.1:7070";
}

Client::Client(const std::string& address)
    : address_(address),
      info_(cohort::v1::Info::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}

StatusOr<cohort::v1::VersionInfo> Client::server_version() {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kDefaultRpcTimeout);
  cohort::v1::VersionInfo info;
  grpc::Status status = info_->GetVersion(&context, cohort::v1::GetVersionRequest(), &info);
  if (!status.ok()) {
    return Status(static_cast<StatusCode>(status.error_code()),
                  "cannot reach cohortd at " + address_ + ": " + status.error_message() +
                      " (is cohortd running? set --coordinator or COHORT_COORDINATOR)");
  }
  return info;
}

}  // namespace cohort::client
