#pragma once

// Test helper: every collective and point-to-point form of a Communicator run on buffers in some
// memory space (CUDA device memory, the FakeDeviceMemory seam, host memory) and compared, byte for
// byte, with the same call on host buffers over the same communicator. Used by the CPU test of
// the staging paths (worker/comm:device_staging_test) and by the GPU tests (tests/gpu).

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/types.h"

namespace cohort::comm::testing {

// Memory the buffers of check_every_collective live in. One per rank thread.
class BufferSpace {
 public:
  virtual ~BufferSpace() = default;
  virtual std::string name() const = 0;
  // `bytes` (at least one byte is allocated) of memory in this space, freed with the space.
  virtual void* allocate(size_t bytes) = 0;
  virtual Status upload(void* to, const void* host, size_t bytes) = 0;
  virtual Status download(void* host, const void* from, size_t bytes) = 0;
};

// Plain host memory.
class HostSpace final : public BufferSpace {
 public:
  std::string name() const override { return "host"; }
  void* allocate(size_t bytes) override;
  Status upload(void* to, const void* host, size_t bytes) override;
  Status download(void* host, const void* from, size_t bytes) override;

 private:
  std::vector<std::unique_ptr<std::vector<uint8_t>>> blocks_;
};

struct CheckOptions {
  size_t count = 37;           // elements per rank block (uneven forms add up to size() - 1)
  bool mixed = true;           // also run with one buffer in host memory and the other in the space
  bool point_to_point = true;  // also a ring of isend/irecv
};

// Runs allreduce (in and out of place, SUM/MAX/AVG), reduce, broadcast, allgather(v), gather(v),
// scatter(v), reduce_scatter(v), alltoall(v) and an isend/irecv ring with buffers in `space`, and
// compares each receive buffer with the same call on host buffers, and each send buffer with its
// input (nothing may clobber it). Inputs are small integers, so every sum is exact whatever the
// order of summation (NCCL's differs from the host algorithms'). Collective: every rank of `comm`
// calls it. The first difference is returned as an error naming the call, rank and element.
Status check_every_collective(Communicator& comm, BufferSpace& space, DataType dtype,
                              const CheckOptions& options = {});

}  // namespace cohort::comm::testing
