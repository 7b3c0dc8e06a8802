#include "worker/base/blas_threads.h"

#include <dlfcn.h>

#include <algorithm>

namespace cohort {

bool set_openblas_threads(int threads) {
  // Looked up, not linked: libtorch reaches BLAS through the libblas.so.3 alternative, which may
  // be any implementation. OpenBLAS's libblas.so.3 loads libopenblas.so.0, which exports this.
  using SetThreads = void (*)(int);
  auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set == nullptr) return false;
  set(std::max(1, threads));
  return true;
}

OpenBlasBuild openblas_build() {
  using GetParallel = int (*)();
  auto get = reinterpret_cast<GetParallel>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  if (get == nullptr) return OpenBlasBuild::kNotOpenBlas;
  switch (get()) {
    case 0:
      return OpenBlasBuild::kSerial;
    case 2:
      return OpenBlasBuild::kOpenMp;
    default:
      return OpenBlasBuild::kPthreads;
  }
}

const char* blas_threads_warning(int threads) {
  if (threads <= 1 || openblas_build() != OpenBlasBuild::kSerial) return "";
  return "libblas.so.3 is the serial OpenBLAS, which is not safe to call from several threads at once, "
         "and libtorch's intra-op threads do: install libopenblas0-pthread (deploy/install-deps.sh) or "
         "select it with `update-alternatives --config libblas.so.3-x86_64-linux-gnu`";
}

}  // namespace cohort
