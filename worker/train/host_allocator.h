#pragma once

// Host-allocator settings for a training process: glibc malloc, which libtorch's CPU tensors use.
//
//   int main(int argc, char** argv) {
//     cohort::train::tune_host_allocator();   // first, before threads and big allocations
//     ...
//   }
//
// Why. glibc maps every allocation above its mmap threshold with its own mmap and unmaps it on
// free, and gives the free top of the heap back to the kernel once it exceeds the trim threshold.
// Both thresholds start small (128 KiB) and only grow with the largest mapped block freed so far,
// so how much of a step's memory goes back to the kernel depends on the process's history. A
// training step allocates and frees tens of MB of activations and gradients (Fashion-MNIST's CNN
// at batch 64: blocks of 0.8-6.4 MB); what went back comes back as fresh zeroed pages, one fault
// per 4 KiB. Measured on bench/train_fashion_mnist (2 ranks, rank 0, --limit 12800): 3 699 minor
// faults and 88.8 ms of CPU per step with glibc's defaults, 134 faults and 81.1 ms with the
// settings below (PyTorch DDP's Python ranks, whose history happens to raise the thresholds: 112
// faults, 85.7 ms). On a node whose ranks share the cores, that CPU is taken from the other ranks.
//
// What. The mmap threshold is fixed at kHostMmapThresholdBytes, so step-sized blocks are reused
// from the heap, while larger ones (whole datasets, evaluation batches) are still mapped and
// returned when freed. The trim threshold is fixed at kHostTrimThresholdBytes: that much free
// memory may stay at the top of the heap for the next step instead of being faulted in again.
// The same run's peak resident memory went from 503 MB to 478 MB per rank (with 32 MiB / 256 MiB
// it rose to 530 MB: the heap then kept evaluation's blocks as well).
//
// The environment wins: when MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_ or
// GLIBC_TUNABLES is set (the operator chose), or COHORT_HOST_ALLOCATOR=default, nothing changes.
//
// Process-wide (glibc's settings); call once at the start of main, before threads and large
// allocations. Other allocators (jemalloc, tcmalloc preloaded) ignore it.

#include <cstddef>

namespace cohort::train {

// Blocks of at least this size are mapped on their own and unmapped when freed; smaller ones
// come from the heap. Above a step's activations for the examples' and the worker's models
// (batch-64 conv outputs: a few MB), below datasets and 1000-sample evaluation batches (25-100 MB).
inline constexpr size_t kHostMmapThresholdBytes = size_t{16} << 20;
// Free memory kept at the top of the heap between steps: a step's transient tensors here (a few
// tens of MB) fit; more would stay resident for nothing.
inline constexpr size_t kHostTrimThresholdBytes = size_t{64} << 20;

// Applies the settings above unless the environment chose (see the header comment). Returns true
// when it changed glibc's settings.
bool tune_host_allocator();

}  // namespace cohort::train
