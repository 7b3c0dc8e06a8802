#pragma once

// gRPC adapter for cohort.v1.Info: reports the daemon's version and roles.

#include <string>
#include <vector>

#include "cohort/v1/info.grpc.pb.h"

namespace cohort::daemon {

class InfoService final : public cohort::v1::Info::Service {
 public:
  // `roles` are the roles this daemon runs ("coordinator", "agent").
  explicit InfoService(std::vector<std::string> roles) : roles_(std::move(roles)) {}

  grpc::Status GetVersion(grpc::ServerContext* context, const cohort::v1::GetVersionRequest* request,
                          cohort::v1::VersionInfo* response) override;

 private:
  const std::vector<std::string> roles_;
};

}  // namespace cohort::daemon
