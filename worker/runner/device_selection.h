#pragma once

// Where a cohort-worker rank trains: the CPU, or the CUDA device its agent gave it. One small,
// pure function over the facts it depends on, so the choice is unit-tested without a GPU.
//
//   COHORT_ASSIGN_OR_RETURN(at::Device device,
//                           select_device(spec.gpus_per_proc(), DeviceEnvironment::current()));
//   std::string kind = spec.communicator().empty() ? default_communicator(device) : spec.communicator();

#include <cstdint>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include "worker/base/status.h"

namespace cohort::worker {

// What the device choice depends on; current() reads this process's libtorch and environment.
struct DeviceEnvironment {
  bool cuda_built = false;                          // this libtorch has CUDA (libc10_cuda loaded)
  bool comm_cuda_built = false;                     // cohort's comm layer was built with --config=cuda
  int64_t cuda_device_count = 0;                    // GPUs this process sees (torch::cuda::device_count())
  std::optional<std::string> cuda_visible_devices;  // CUDA_VISIBLE_DEVICES, when set
  std::optional<std::string> local_rank;            // LOCAL_RANK, when set

  static DeviceEnvironment current();
};

// gpus_per_proc <= 0: the CPU. Otherwise cuda:0 when CUDA_VISIBLE_DEVICES is set (cohortd's
// agent sets it to this rank's GPUs, so index 0 is the rank's first one), else cuda:(LOCAL_RANK
// mod device count) (LOCAL_RANK unset: 0). FAILED_PRECONDITION, naming the fix, when the job asks
// for GPUs but this libtorch has no CUDA, cohort was built without --config=cuda, or no GPU is
// visible. Pure.
StatusOr<c10::Device> select_device(int64_t gpus_per_proc, const DeviceEnvironment& environment);

// The communicator kind for a job whose spec names none: "pure_nccl" on CUDA (NCCL carries the
// device buffers), "flat" on the CPU.
std::string default_communicator(const c10::Device& device);

}  // namespace cohort::worker
