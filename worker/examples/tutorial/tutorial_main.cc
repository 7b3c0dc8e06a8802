// The programs of PyTorch's "Writing Distributed Applications" tutorial on cohort::distributed,
// one binary each (BUILD compiles this file once per program with TUTORIAL_PROGRAM set):
//
//   tutorial_p2p --ranks 2              # blocking send / recv       → Rank 0 has data 1 ...
//   tutorial_p2p_nonblocking --ranks 2  # isend / irecv + wait
//   tutorial_collectives --ranks 4      # the six collectives over new_group([0, 1])
//   tutorial_sync_sgd --ranks 2         # synchronous SGD with average_gradients
//   tutorial_ring_allreduce --ranks 3   # the hand-written ring allreduce
//   tutorial_p2p --init env://          # one rank of a job started by a launcher
//
// Flags: see worker/examples/example_flags.h (--ranks, --init, --kind, --epochs). Every rank
// prints its lines on stdout; exit 0 on success, 1 with the error on stderr.

#include <cstdio>
#include <exception>
#include <iostream>
#include <sstream>

#include "worker/examples/example_flags.h"
#include "worker/examples/example_rank.h"
#include "worker/examples/tutorial/tutorial_programs.h"

#ifndef TUTORIAL_PROGRAM
#error "TUTORIAL_PROGRAM must name the program (BUILD sets it)"
#endif
#define COHORT_STRINGIFY2(x) #x
#define COHORT_STRINGIFY(x) COHORT_STRINGIFY2(x)

namespace tutorial = cohort::examples::tutorial;

namespace {

constexpr const char* kProgram = "tutorial_" COHORT_STRINGIFY(TUTORIAL_PROGRAM);
// Shown by --help (and after a flag error): the program's purpose and its flags.
constexpr const char* kDescription =
    "A program of PyTorch's \"Writing Distributed Applications\" tutorial on cohort::distributed.\n"
    "Without --init it starts --ranks local ranks (default 2; tutorial_collectives: 4); --epochs sets\n"
    "tutorial_sync_sgd's epochs (default 5). Every rank prints the tutorial's lines on stdout.\n";

void run(cohort::comm::Communicator& world, const cohort::examples::ExampleFlags& flags, std::ostream& out) {
  const std::string program = COHORT_STRINGIFY(TUTORIAL_PROGRAM);
  if (program == "p2p") {
    tutorial::blocking_p2p(world, out);
  } else if (program == "p2p_nonblocking") {
    tutorial::nonblocking_p2p(world, out);
  } else if (program == "collectives") {
    tutorial::group_collectives(world, out);
  } else if (program == "sync_sgd") {
    tutorial::SgdOptions options;
    options.epochs = flags.epochs;
    tutorial::sync_sgd(world, out, options);
  } else {
    tutorial::ring_allreduce_demo(world, out);
  }
}

}  // namespace

int main(int argc, char** argv) {
  cohort::examples::ExampleFlags flags;
  flags.ranks = std::string(kProgram) == "tutorial_collectives" ? 4 : 2;
  flags.epochs = 5;
  int exit_code = 0;
  auto world = cohort::examples::start_example_rank(argc, argv, kProgram, kDescription, flags, &exit_code);
  if (world == nullptr) return exit_code;
  try {
    std::ostringstream out;  // one write per rank: lines of concurrent ranks do not interleave
    run(*world, flags, out);
    std::cout << out.str() << std::flush;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d: %s\n", kProgram, world->rank(), e.what());
    return 1;
  }
  return 0;
}
