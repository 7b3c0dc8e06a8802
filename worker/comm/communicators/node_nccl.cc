#include "worker/comm/communicators/node_nccl.h"

#include <set>

#include <spdlog/spdlog.h>

#include "worker/comm/transport/nccl/device_memory.h"
#if COHORT_CUDA
#include "worker/comm/transport/nccl/nccl_transport.h"
#endif

namespace cohort::comm {

std::string device_id_record(int device) {
  std::string record = device_id(device);
  record.resize(kDeviceIdBytes, '\0');
  return record;
}

StatusOr<std::shared_ptr<NcclTransport>> make_node_nccl(const std::vector<std::string>& device_ids,
                                                        Store& store, int node_rank, int device,
                                                        const std::string& key_prefix, const std::string& who,
                                                        Deadline deadline) {
  const std::string none(kDeviceIdBytes, '\0');
  std::set<std::string> distinct(device_ids.begin(), device_ids.end());
  if (!cuda_build() || distinct.size() != device_ids.size() || distinct.count(none) != 0) {
    spdlog::info(
        "{}: the node's {} ranks do not each have their own GPU; device buffers are staged through host "
        "memory",
        who, device_ids.size());
    return std::shared_ptr<NcclTransport>();
  }
#if COHORT_CUDA
  NcclOptions options;
  options.key_prefix = key_prefix;
  options.init_timeout = deadline.remaining();
  options.device = device;
  COHORT_ASSIGN_OR_RETURN(
      std::unique_ptr<NcclTransport> nccl,
      NcclTransport::create(store, node_rank, static_cast<int>(device_ids.size()), options));
  return std::shared_ptr<NcclTransport>(std::move(nccl));
#else
  (void)store;
  (void)node_rank;
  (void)device;
  (void)key_prefix;
  (void)deadline;
  return std::shared_ptr<NcclTransport>();
#endif
}

}  // namespace cohort::comm
