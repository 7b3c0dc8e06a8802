#include "worker/base/blas_threads.h"

#include <dlfcn.h>

#include <algorithm>

namespace cohort {

namespace {

// OpenBLAS's `name`, or null when no OpenBLAS is loaded. libtorch reaches BLAS through the
// libblas.so.3 alternative, which may be any implementation; OpenBLAS's libblas.so.3 loads
// libopenblas.so.0, which exports the control functions. Looked up, not linked. The global scope
// first (an executable linked with libtorch), then libopenblas.so.0 itself if it is loaded at
// all (a program that dlopen'ed libtorch with RTLD_LOCAL, as Python does): RTLD_NOLOAD never
// loads a second copy.
void* openblas_function(const char* name) {
  if (void* found = dlsym(RTLD_DEFAULT, name); found != nullptr) return found;
  void* library = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) return nullptr;
  void* found = dlsym(library, name);
  dlclose(library);  // drops the reference NOLOAD took; the library stays loaded
  return found;
}

}  // namespace

bool set_openblas_threads(int threads) {
  using SetThreads = void (*)(int);
  auto set = reinterpret_cast<SetThreads>(openblas_function("openblas_set_num_threads"));
  if (set == nullptr) return false;
  set(std::max(1, threads));
  return true;
}

OpenBlasBuild openblas_build() {
  using GetParallel = int (*)();
  auto get = reinterpret_cast<GetParallel>(openblas_function("openblas_get_parallel"));
  if (get == nullptr) return OpenBlasBuild::kNotOpenBlas;
  switch (get()) {  // OpenBLAS's own codes
    case 0:
      return OpenBlasBuild::kSerial;
    case 1:
      return OpenBlasBuild::kPthreads;
    case 2:
      return OpenBlasBuild::kOpenMp;
    default:
      return OpenBlasBuild::kNotOpenBlas;  // a code this file does not know
  }
}

const char* blas_threads_warning(int threads) {
  if (threads <= 1 || openblas_build() != OpenBlasBuild::kSerial) return "";
  return "libopenblas.so.0 is the serial OpenBLAS, which is not safe to call from several threads at once, "
         "and libtorch's intra-op threads do: install libopenblas0-pthread (deploy/install-deps.sh), or select it "
         "with `update-alternatives --auto libopenblas.so.0-x86_64-linux-gnu` (and libblas.so.3-x86_64-linux-gnu)";
}

}  // namespace cohort
