// The thread count of the BLAS behind libtorch. libtorch's at::set_num_threads sets its own
// intra-op threads but not OpenBLAS's: Debian's threaded OpenBLAS (libopenblas0-pthread, what
// deploy/install-deps.sh installs) starts one thread per core in every process unless told
// otherwise, so N ranks on one node would run N x cores BLAS threads. A rank that sets its
// intra-op threads sets its BLAS threads to the same count with this.
//
// Why the threaded build and not the serial one: Debian's serial OpenBLAS is built without
// locking, and two threads of one process calling it at once share its work buffers and get
// wrong results (tests/train:blas_thread_safety_test shows it). libtorch itself calls BLAS from
// its intra-op threads (convolution over the batch), so that is not only a test's problem.
#pragma once

namespace cohort {

// Tells the process's OpenBLAS to use `threads` (at least 1) threads per call, process-wide.
// Returns false, and does nothing, when no OpenBLAS is loaded into the process (the netlib
// reference BLAS, for one, has no threads to set). Call it at startup, before threads start BLAS
// work: OpenBLAS reads the count without synchronisation.
bool set_openblas_threads(int threads);

// How the process's OpenBLAS was built to run, from openblas_get_parallel(): kSerial (no locking:
// unsafe to call from two threads at once), kPthreads or kOpenMp; kNotOpenBlas when no OpenBLAS
// is loaded (or it answers a code this does not know).
enum class OpenBlasBuild { kNotOpenBlas, kSerial, kPthreads, kOpenMp };
OpenBlasBuild openblas_build();

// A warning for a process that will call BLAS from `threads` threads (libtorch's intra-op threads)
// when its BLAS cannot take that, naming the fix; empty when it can.
const char* blas_threads_warning(int threads);

}  // namespace cohort
