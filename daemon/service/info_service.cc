#include "daemon/service/info_service.h"

#include "worker/base/version.h"

namespace cohort::daemon {

grpc::Status InfoService::GetVersion(grpc::ServerContext* /*context*/,
                                     const cohort::v1::GetVersionRequest* /*request*/,
                                     cohort::v1::VersionInfo* response) {
  response->set_component("cohortd");
  response->set_version(kVersion);
  for (const std::string& role : roles_) response->add_roles(role);
  return grpc::Status::OK;
}

}  // namespace cohort::daemon
