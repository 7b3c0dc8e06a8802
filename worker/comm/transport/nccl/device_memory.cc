#include "worker/comm/transport/nccl/device_memory.h"

#if COHORT_CUDA
#include <cuda_runtime_api.h>

#include "worker/comm/transport/nccl/cuda_check.h"
#endif

namespace cohort::comm {

#if COHORT_CUDA

bool cuda_build() { return true; }

bool is_device_memory(const void* ptr) {
  if (ptr == nullptr) return false;
  // A CUDA build on a machine without a GPU (or driver) asks the runtime once, not per call.
  static const bool any_device = cuda_device_count() > 0;
  if (!any_device) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    // Older drivers report unregistered host memory as an error: clear it so it does not surface
    // in the next unrelated cudaGetLastError.
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string current_device_id() {
  int device = -1;
  char bus_id[64] = {};
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return bus_id;
}

Status copy_to_host(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return ok_status();
  return COHORT_CUDA_CHECK(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
}

Status copy_to_device(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return ok_status();
  return COHORT_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

StatusOr<void*> PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  if (data_ != nullptr) {
    cudaFreeHost(data_);
    data_ = nullptr;
    capacity_ = 0;
  }
  void* data = nullptr;
  COHORT_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data, bytes == 0 ? 1 : bytes));
  data_ = data;
  capacity_ = bytes;
  return data_;
}

#else  // CPU-only build

namespace {
Status needs_cuda_build(const char* what) {
  return failed_precondition_error(
      "{} needs a CUDA build: bazel build --config=cuda ... (on a machine with the CUDA toolkit)", what);
}
}  // namespace

bool cuda_build() { return false; }
bool is_device_memory(const void*) { return false; }
int cuda_device_count() { return 0; }
std::string current_device_id() { return ""; }
Status copy_to_host(void*, const void*, size_t) { return needs_cuda_build("copying device memory"); }
Status copy_to_device(void*, const void*, size_t) { return needs_cuda_build("copying to device memory"); }
PinnedBuffer::~PinnedBuffer() = default;
StatusOr<void*> PinnedBuffer::reserve(size_t) { return needs_cuda_build("pinned host memory"); }

#endif

}  // namespace cohort::comm
