#pragma once

// NCCL among the ranks of one node, for the kinds that run device buffers with NCCL inside a
// node (hierarchical, single_node) and host transports between nodes. NCCL needs one GPU per
// rank, so it is used only when the node's ranks name distinct GPUs; otherwise (ranks sharing a
// GPU, or a CPU-only build) callers stage device buffers through host memory instead.

#include <memory>
#include <string>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/store/store.h"

namespace cohort::comm {

class NcclTransport;

// A fixed-size record of CUDA device `device` (its PCI bus id; all zero bytes for -1 or without
// one), for the node's ranks to allgather.
inline constexpr size_t kDeviceIdBytes = 32;
std::string device_id_record(int device);

// Given every node rank's device_id_record() (in node-rank order), makes the node's NCCL
// communicator on `device` (this rank's GPU) when the GPUs are distinct, else returns nullptr.
// Collective over the node's ranks (each reaches the same decision from the same records).
// `key_prefix` must be unique per node and communicator. Blocking, until `deadline`.
StatusOr<std::shared_ptr<NcclTransport>> make_node_nccl(const std::vector<std::string>& device_ids,
                                                        Store& store, int node_rank, int device,
                                                        const std::string& key_prefix, const std::string& who,
                                                        Deadline deadline);

}  // namespace cohort::comm
