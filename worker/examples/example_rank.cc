#include "worker/examples/example_rank.h"

#include <ATen/Parallel.h>

#include <cstdio>
#include <string>

#include "worker/base/blas_threads.h"
#include "worker/base/process_liveness.h"
#include "worker/comm/bootstrap.h"
#include "worker/examples/local_ranks.h"
#include "worker/train/host_allocator.h"

namespace cohort::examples {

std::unique_ptr<comm::Communicator> start_example_rank(int argc, char** argv, const char* program,
                                                       const char* description, ExampleFlags& flags, int* exit_code,
                                                       ExampleFlagSet set) {
  if (std::optional<int> exit = parse_example_flags(argc, argv, program, description, flags, set)) {
    *exit_code = *exit;
    return nullptr;
  }
  if (flags.init.empty()) {
    *exit_code = run_local_ranks(argc, argv, flags.ranks, *parse_cpu_bind(flags.cpu_bind));
    return nullptr;
  }
  // Each rank is one process of several sharing the machine's cores: one intra-op thread, and
  // one BLAS thread (worker/base/blas_threads.h).
  at::set_num_threads(1);
  set_openblas_threads(1);
  // Before the dataset and the model allocate: keeps each step's tensors in the heap instead of
  // faulting them in again every step (train/host_allocator.h).
  train::tune_host_allocator();
  auto comm = comm::create_communicator(flags.kind, comm::InitOptions::from_url(flags.init));
  if (!comm.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, comm.status().to_string().c_str());
    *exit_code = 1;
    return nullptr;
  }
  *exit_code = 0;
  return std::move(comm).value();
}

StatusOr<bool> all_ranks_on_this_host(comm::Communicator& comm) {
  const std::string boot_id = this_process().boot_id;
  StatusOr<std::vector<std::string>> all = comm.allgather_obj(boot_id);
  if (!all.ok()) return all.status();
  for (const std::string& id : *all) {
    if (id.empty() || id != boot_id) return false;
  }
  return true;
}

}  // namespace cohort::examples
