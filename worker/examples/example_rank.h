#pragma once

// The start every example and the training benchmark share:
//
//   ExampleFlags flags;
//   flags.ranks = 2;
//   int exit_code = 0;
//   auto comm = start_example_rank(argc, argv, "train_mnist_dp", kDescription, flags, &exit_code);
//   if (comm == nullptr) return exit_code;   // flags error, or the launcher parent finished
//
// Parses the flags (example_flags.h: `description` under the usage line, the flags of `set`);
// without --init, starts flags.ranks local ranks (re-executing this binary) and
// returns nullptr once they exit; with --init, joins the job with one intra-op thread and returns
// the communicator of flags.kind. Errors are printed to stderr prefixed with `program`.

#include <memory>
#include <string>

#include "worker/comm/communicator.h"
#include "worker/examples/example_flags.h"

namespace cohort::examples {

std::unique_ptr<comm::Communicator> start_example_rank(int argc, char** argv, const char* program,
                                                       const char* description, ExampleFlags& flags, int* exit_code,
                                                       ExampleFlagSet set = {});

// Whether every rank of `comm` runs under this rank's kernel (the same boot id: one host, network
// namespaces included), so that their CLOCK_MONOTONIC readings compare. Collective.
StatusOr<bool> all_ranks_on_this_host(comm::Communicator& comm);

}  // namespace cohort::examples
