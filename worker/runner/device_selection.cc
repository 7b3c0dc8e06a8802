#include "worker/runner/device_selection.h"

#include <cstdlib>
#include <exception>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include "worker/comm/transport/nccl/device_memory.h"

namespace cohort::worker {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

}  // namespace

DeviceEnvironment DeviceEnvironment::current() {
  DeviceEnvironment environment;
  // libc10_cuda registers CUDA's device guard when it loads: present exactly in a CUDA libtorch,
  // with or without a visible GPU (at::hasCUDA() also needs a GPU).
  environment.cuda_built = c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA);
  environment.cuda_device_count =
      environment.cuda_built ? static_cast<int64_t>(torch::cuda::device_count()) : 0;
  environment.comm_cuda_built = comm::cuda_build();
  environment.cuda_visible_devices = env("CUDA_VISIBLE_DEVICES");
  environment.local_rank = env("LOCAL_RANK");
  return environment;
}

StatusOr<c10::Device> select_device(int64_t gpus_per_proc, const DeviceEnvironment& environment) {
  if (gpus_per_proc <= 0) return c10::Device(c10::kCPU);
  if (!environment.cuda_built) {
    return failed_precondition_error(
        "the job asks for {} GPU(s) per rank but this cohort-worker's libtorch has no CUDA; rebuild "
        "cohort-worker with "
        "`bazel build --repo_env=COHORT_LIBTORCH=<a CUDA libtorch> --config=cuda //worker/runner:cohort-worker`, or "
        "set "
        "`gpus_per_proc: 0` in the job spec to train on the CPU",
        gpus_per_proc);
  }
  if (!environment.comm_cuda_built) {
    return failed_precondition_error(
        "the job asks for {} GPU(s) per rank but this cohort-worker was built without --config=cuda, so its "
        "communicators cannot read GPU memory; rebuild with `bazel build --repo_env=COHORT_LIBTORCH=<a CUDA "
        "libtorch> --config=cuda //worker/runner:cohort-worker`, or set `gpus_per_proc: 0` in the job spec",
        gpus_per_proc);
  }
  if (environment.cuda_device_count < 1) {
    return failed_precondition_error(
        "the job asks for {} GPU(s) per rank but no GPU is visible to this cohort-worker "
        "(CUDA_VISIBLE_DEVICES={}); "
        "check the node's GPUs and driver (nvidia-smi), or set `gpus_per_proc: 0` in the job spec to train "
        "on the "
        "CPU",
        gpus_per_proc, environment.cuda_visible_devices.value_or("<unset>"));
  }
  if (environment.cuda_visible_devices.has_value()) return c10::Device(c10::kCUDA, 0);
  int64_t local_rank = 0;
  if (environment.local_rank.has_value()) {
    try {
      local_rank = std::stoll(*environment.local_rank);
    } catch (const std::exception&) {
      return invalid_argument_error("LOCAL_RANK is '{}'; expected a non-negative integer",
                                    *environment.local_rank);
    }
    if (local_rank < 0) {
      return invalid_argument_error("LOCAL_RANK is {}; expected a non-negative integer", local_rank);
    }
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank % environment.cuda_device_count));
}

std::string default_communicator(const c10::Device& device) {
  return device.is_cuda() ? "pure_nccl" : "flat";
}

}  // namespace cohort::worker
