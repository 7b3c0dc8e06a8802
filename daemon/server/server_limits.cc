#include "daemon/server/server_limits.h"

#include <algorithm>

#include <grpc/grpc.h>
#include <grpcpp/resource_quota.h>

namespace cohort::daemon {

void apply_server_limits(grpc::ServerBuilder& builder) {
  grpc::ResourceQuota quota("cohortd");
  quota.SetMaxThreads(kMaxServerThreads);
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  builder.SetMaxSendMessageSize(kMaxSendMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxConcurrentStreams);
}

std::chrono::milliseconds clamp_client_timeout(std::chrono::milliseconds requested) {
  return std::clamp(requested, std::chrono::milliseconds(0), kMaxClientTimeout);
}

}  // namespace cohort::daemon
