#pragma once

// Device memory as the host-side communication code sees it: telling device pointers from host
// ones, and copying between them through a pinned host staging buffer. Compiled in every build:
// without CUDA (a CPU-only build) no pointer is device memory, so callers need no #if.
//
// Used where a communicator or tool accepts device buffers but moves them over a host transport
// (UCX here has no CUDA transport): stage to pinned host memory, run the host path, copy back.

#include <cstddef>
#include <memory>
#include <string>

#include "worker/base/status.h"

namespace cohort::comm {

// True when this binary was built with --config=cuda (it may still see no GPU).
bool cuda_build();

// True when `ptr` is CUDA device or managed memory; false for host memory (pinned or not), null,
// and always in a CPU-only build. Thread-safe; a few microseconds (cudaPointerGetAttributes).
bool is_device_memory(const void* ptr);

// Number of CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 in a CPU-only build,
// without a driver, or without a GPU. Never fails.
int cuda_device_count();

// The calling thread's current CUDA device, or -1 in a CPU-only build or without a device.
int current_cuda_device();

// The device a rank uses when nobody named one: LOCAL_RANK mod the device count when a launcher
// set LOCAL_RANK (torchrun's convention), else the calling thread's current device (ranks as
// threads select theirs first); -1 in a CPU-only build or without a device.
int default_cuda_device();

// Makes `device` current on the calling thread (no-op for device < 0 or in a CPU-only build):
// threads a communicator starts work on its rank's GPU, not on device 0.
void set_current_cuda_device(int device);

// An identity of CUDA device `device` (this process's numbering) that is the same in every
// process using that GPU, whatever CUDA_VISIBLE_DEVICES renumbers it to (its PCI bus id,
// "0000:3b:00.0"); "" in a CPU-only build, for device < 0, or without a device. Used to tell
// whether the ranks of a node have a GPU each.
std::string device_id(int device);

// Synchronous copies between device and host memory (either side may be pinned or pageable).
// They run on the legacy default stream of the device buffer's own GPU (whichever device the
// calling thread has current), so they wait for work already issued there (torch's default
// stream). FAILED_PRECONDITION in a CPU-only build.
Status copy_to_host(void* host, const void* device, size_t bytes);
Status copy_to_device(void* device, const void* host, size_t bytes);

// Page-locked host memory for staging: device copies to and from it run at full PCIe speed and
// without a bounce buffer inside the driver. Grows on demand; not thread-safe (one per user).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes` of pinned memory (contents not preserved on growth). FAILED_PRECONDITION in a
  // CPU-only build, RESOURCE_EXHAUSTED when the driver cannot pin that much.
  StatusOr<void*> reserve(size_t bytes);

 private:
  void release();

  void* data_ = nullptr;
  size_t capacity_ = 0;
  bool heap_ = false;  // allocated by the FakeDeviceMemory seam: freed with std::free
};

// Test seam: while one exists, the memory it allocates counts as device memory for
// is_device_memory(), copies to and from device memory are memcpy, PinnedBuffer takes plain heap
// memory, and the bytes copied each way are counted. The staging paths of the communicators thus
// run, and are checked, in a CPU-only build (a bug that reads a "device" buffer directly still
// computes the right values, but leaves the counters short). At most one per process; thread-safe.
class FakeDeviceMemory {
 public:
  FakeDeviceMemory();
  ~FakeDeviceMemory();  // frees what it allocated
  FakeDeviceMemory(const FakeDeviceMemory&) = delete;
  FakeDeviceMemory& operator=(const FakeDeviceMemory&) = delete;

  // `bytes` of zeroed "device" memory (at least one byte is allocated).
  void* allocate(size_t bytes);
  // Bytes copied by copy_to_host / copy_to_device since creation or the last reset_counters().
  size_t bytes_to_host() const;
  size_t bytes_to_device() const;
  void reset_counters();
};

}  // namespace cohort::comm
