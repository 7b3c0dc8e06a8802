#pragma once

// The one mapping between cohort's Status and grpc::Status (STYLE rule 4). cohort's StatusCode
// numbers are gRPC's, so the code converts by a cast; the message travels unchanged.
//
//   grpc::Status Service::GetJob(...) { ... return to_grpc_status(job.status()); }
//   Status status = from_grpc_status(stub->GetJob(&context, request, &response));

#include <string_view>

#include <grpcpp/grpcpp.h>

#include "worker/base/status.h"

namespace cohort {

// The gRPC status carrying `status`'s code and message. Non-blocking.
grpc::Status to_grpc_status(const Status& status);

// The cohort Status carrying `status`'s code and message. A code outside gRPC's range becomes
// UNKNOWN. Non-blocking.
Status from_grpc_status(const grpc::Status& status);

// As from_grpc_status, with "<rpc> to <target>: " prepended to an error's message so a client's
// error names the call that failed and where it went ("Rendezvous.Join to 10.0.0.1:7070: ...").
Status from_grpc_status(const grpc::Status& status, std::string_view rpc, std::string_view target);

}  // namespace cohort
