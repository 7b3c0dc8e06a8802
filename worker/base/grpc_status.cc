#include "worker/base/grpc_status.h"

#include <fmt/format.h>

namespace cohort {

grpc::Status to_grpc_status(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

Status from_grpc_status(const grpc::Status& status) {
  if (status.ok()) return ok_status();
  const int code = static_cast<int>(status.error_code());
  const bool known =
      code > static_cast<int>(StatusCode::kOk) && code <= static_cast<int>(StatusCode::kUnauthenticated);
  return Status(known ? static_cast<StatusCode>(code) : StatusCode::kUnknown, status.error_message());
}

Status from_grpc_status(const grpc::Status& status, std::string_view rpc, std::string_view target) {
  return from_grpc_status(status).with_context(fmt::format("{} to {}", rpc, target));
}

}  // namespace cohort
