#include "worker/comm/transport/nccl/device_memory.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#if COHORT_CUDA
#include <cuda_runtime_api.h>

#include "worker/comm/transport/nccl/cuda_check.h"
#endif

namespace cohort::comm {
namespace {

// The FakeDeviceMemory seam's state. `active` is read first on every call so production code pays
// one relaxed load for it.
struct FakeState {
  std::atomic<bool> active{false};
  std::mutex mutex;
  std::map<uintptr_t, size_t> ranges;  // start → bytes, guarded by mutex
  std::atomic<size_t> to_host{0};
  std::atomic<size_t> to_device{0};
};

FakeState& fake() {
  static FakeState* state = new FakeState();  // never destroyed: used from static destructors
  return *state;
}

bool fake_active() { return fake().active.load(std::memory_order_acquire); }

bool fake_contains(const void* ptr) {
  FakeState& state = fake();
  auto address = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(state.mutex);
  auto after = state.ranges.upper_bound(address);
  if (after == state.ranges.begin()) return false;
  auto range = std::prev(after);
  return address < range->first + range->second;
}

Status fake_copy(void* to, const void* from, size_t bytes, std::atomic<size_t>& counter) {
  if (bytes > 0) std::memcpy(to, from, bytes);
  counter.fetch_add(bytes, std::memory_order_relaxed);
  return ok_status();
}

}  // namespace

FakeDeviceMemory::FakeDeviceMemory() {
  bool was_active = fake().active.exchange(true);
  if (was_active) std::abort();  // two at once would share counters: a test bug
  reset_counters();
}

FakeDeviceMemory::~FakeDeviceMemory() {
  FakeState& state = fake();
  std::lock_guard<std::mutex> lock(state.mutex);
  for (const auto& [start, bytes] : state.ranges) std::free(reinterpret_cast<void*>(start));
  state.ranges.clear();
  state.active.store(false, std::memory_order_release);
}

void* FakeDeviceMemory::allocate(size_t bytes) {
  void* data = std::calloc(bytes == 0 ? 1 : bytes, 1);
  if (data == nullptr) std::abort();
  std::lock_guard<std::mutex> lock(fake().mutex);
  fake().ranges[reinterpret_cast<uintptr_t>(data)] = bytes == 0 ? 1 : bytes;
  return data;
}

size_t FakeDeviceMemory::bytes_to_host() const { return fake().to_host.load(); }
size_t FakeDeviceMemory::bytes_to_device() const { return fake().to_device.load(); }
void FakeDeviceMemory::reset_counters() {
  fake().to_host = 0;
  fake().to_device = 0;
}

PinnedBuffer::~PinnedBuffer() { release(); }

void PinnedBuffer::release() {
  if (data_ != nullptr) {
    if (heap_) {
      std::free(data_);
    } else {
#if COHORT_CUDA
      cudaFreeHost(data_);
#endif
    }
  }
  data_ = nullptr;
  capacity_ = 0;
}

#if COHORT_CUDA

bool cuda_build() { return true; }

bool is_device_memory(const void* ptr) {
  if (ptr == nullptr) return false;
  if (fake_active()) return fake_contains(ptr);
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

int current_cuda_device() {
  if (cuda_device_count() <= 0) return -1;
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return device;
}

int default_cuda_device() {
  int count = cuda_device_count();
  if (count <= 0) return -1;
  if (const char* local_rank = std::getenv("LOCAL_RANK"); local_rank != nullptr && *local_rank != '\0') {
    int local = std::atoi(local_rank);
    return local >= 0 ? local % count : 0;
  }
  return current_cuda_device();
}

void set_current_cuda_device(int device) {
  if (device >= 0 && cudaSetDevice(device) != cudaSuccess) cudaGetLastError();
}

std::string device_id(int device) {
  char bus_id[64] = {};
  if (device < 0 || cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return bus_id;
}

namespace {

// Makes the GPU that owns `ptr` current for the scope: cudaMemcpy orders itself after the legacy
// default stream of the *current* device only, and staging runs on executor threads whose current
// device is whatever they started with.
class PointerDeviceGuard {
 public:
  explicit PointerDeviceGuard(const void* ptr) {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (attributes.device < 0 || cudaGetDevice(&previous_) != cudaSuccess || previous_ == attributes.device) {
      previous_ = -1;
      return;
    }
    if (cudaSetDevice(attributes.device) != cudaSuccess) previous_ = -1;
  }
  ~PointerDeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  PointerDeviceGuard(const PointerDeviceGuard&) = delete;
  PointerDeviceGuard& operator=(const PointerDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace

Status copy_to_host(void* host, const void* device, size_t bytes) {
  if (fake_active()) return fake_copy(host, device, bytes, fake().to_host);
  if (bytes == 0) return ok_status();
  PointerDeviceGuard guard(device);
  return COHORT_CUDA_CHECK(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
}

Status copy_to_device(void* device, const void* host, size_t bytes) {
  if (fake_active()) return fake_copy(device, host, bytes, fake().to_device);
  if (bytes == 0) return ok_status();
  PointerDeviceGuard guard(device);
  return COHORT_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
}

#else  // CPU-only build

namespace {
Status needs_cuda_build(const char* what) {
  return failed_precondition_error(
      "{} needs a CUDA build: bazel build --config=cuda ... (on a machine with the CUDA toolkit)", what);
}
}  // namespace

bool cuda_build() { return false; }
bool is_device_memory(const void* ptr) { return ptr != nullptr && fake_active() && fake_contains(ptr); }
int cuda_device_count() { return 0; }
int current_cuda_device() { return -1; }
int default_cuda_device() { return -1; }
void set_current_cuda_device(int) {}
std::string device_id(int) { return ""; }
Status copy_to_host(void* host, const void* device, size_t bytes) {
  if (fake_active()) return fake_copy(host, device, bytes, fake().to_host);
  return needs_cuda_build("copying device memory");
}
Status copy_to_device(void* device, const void* host, size_t bytes) {
  if (fake_active()) return fake_copy(device, host, bytes, fake().to_device);
  return needs_cuda_build("copying to device memory");
}

#endif

StatusOr<void*> PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  release();
  void* data = nullptr;
  if (fake_active()) {
    data = std::malloc(bytes == 0 ? 1 : bytes);
    if (data == nullptr) return resource_exhausted_error("cannot allocate {} bytes of staging memory", bytes);
    heap_ = true;
  } else {
#if COHORT_CUDA
    COHORT_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data, bytes == 0 ? 1 : bytes));
    heap_ = false;
#else
    return needs_cuda_build("pinned host memory");
#endif
  }
  data_ = data;
  capacity_ = bytes;
  return data_;
}

}  // namespace cohort::comm
