#pragma once

// Checkpoint and resume of a data-parallel run (ChainerMN's create_multi_node_checkpointer):
// every rank saves its own state — registered modules (parameters and buffers), optimizers (their
// state, e.g. SGD momentum), plain tensors, RNG generators, iterator positions — and the iteration,
// to its own file; resume() loads the newest iteration that every rank has.
//
//   auto checkpointer = create_multi_node_checkpointer("mnist", *comm, "/var/tmp/ckpt");
//   checkpointer->add_module("model", *model);
//   checkpointer->add_optimizer("sgd", sgd);
//   checkpointer->add_iterator("train", *train_iterator);
//   int64_t start = checkpointer->resume().value().value_or(0);   // collective
//   for (int64_t it = start; it < steps; ++it) {
//     train_step();
//     if ((it + 1) % 1000 == 0) throw_if_error(checkpointer->save(it + 1), "checkpoint");
//   }
//
// Files: <directory>/<name>.iter<iteration, 12 digits>.rank<rank>of<size>.pt, each a libtorch
// archive. A save writes <file>.tmp, fsyncs it, renames it into place and fsyncs the directory,
// so a crash leaves either the old set of files or the new one, never a torn file under a final
// name. Garbage collection deletes this rank's generations older than the one just saved beyond
// the newest keep_generations — only after every rank has reported its save complete, so the
// generation that resume() would pick is never lost.
//
// Files of another run are never mixed in silently: resume() fails when the directory holds a
// checkpoint of another world size and none of this one, and a save() without a resume() before
// it fails when the directory holds newer iterations (both FAILED_PRECONDITION, naming them). A
// run that starts from scratch calls check_fresh_start() first, which refuses any checkpoint of
// its name before any work is spent.
//
// Devices: module parameters and buffers, and registered tensors, on a CUDA device are written as
// host copies (the file loads into a CPU or a GPU model) and loaded back onto the device of the
// registered tensor. Optimizer state is written by the optimizer's own serializer: state on a GPU
// keeps its device in the file, so such a file needs a CUDA libtorch to load.
//
// Exclusive use (issue 16): the first save() or resume() that finds the directory takes an flock on
// <directory>/<name>.rank<R>of<N>.lock, held until the checkpointer is destroyed, so two attempts of
// a job (an old one still running on a partitioned node, and its restart) never write the same
// files at once: the second gets FAILED_PRECONDITION naming the lock file and its holder. The lock
// dies with its process, so a killed attempt never leaves the directory locked.
//
// Thread-safety: one training thread uses a checkpointer. Registered objects must outlive it.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"
#include "worker/train/multi_node_iterator.h"

namespace cohort::train {

// Generations kept per rank: the newest, plus one in case the newest is incomplete on some rank.
inline constexpr int kDefaultKeepGenerations = 2;

// One checkpoint file's identity, from its name.
struct CheckpointFile {
  int64_t iteration = 0;
  int rank = 0;
  int size = 0;  // the world size that saved it
};

struct CheckpointerOptions {
  int keep_generations = kDefaultKeepGenerations;  // this rank's newest files kept after a save (>= 1)
};

class MultiNodeCheckpointer {
 public:
  // Local; the directory is created by the first save().
  MultiNodeCheckpointer(std::string name, comm::Communicator& comm, std::string directory,
                        CheckpointerOptions options = {});
  // Releases the directory's lock.
  ~MultiNodeCheckpointer();
  MultiNodeCheckpointer(const MultiNodeCheckpointer&) = delete;
  MultiNodeCheckpointer& operator=(const MultiNodeCheckpointer&) = delete;

  // Registration (local): each `key` names a section of the file; a section must be registered
  // on resume under the same key as on save. Objects are referenced, not copied.
  void add_module(const std::string& key, torch::nn::Module& module);
  void add_optimizer(const std::string& key, torch::optim::Optimizer& optimizer);
  // Tensors restored in place (copy_ into the same storage), e.g. parameters held as leaf tensors.
  void add_tensors(const std::string& key, std::vector<at::Tensor> tensors);
  void add_generator(const std::string& key, at::Generator generator);
  // Saves the position and the shuffle seed; resume() fails when the seed differs.
  void add_iterator(const std::string& key, BatchIterator& iterator);

  // Saves this rank's state as `iteration` (atomically), then garbage-collects this rank's
  // generations older than `iteration` beyond keep_generations (never `iteration` itself, nor
  // newer ones). Collective and blocking: after writing, ranks agree (one allreduce) whether
  // every rank saved; on failure anywhere every rank returns an error and deletes nothing.
  // The first save() of a checkpointer on which resume() was not called refuses (FAILED_PRECONDITION,
  // writing nothing) when the directory already holds newer iterations of this name and size:
  // another run's, which a later resume() would load instead of this run's.
  Status save(int64_t iteration);

  // Loads the newest iteration present for every rank (the ranks' lists of iterations are
  // allgathered and intersected), or returns nullopt — loading nothing — when there is none.
  // When there is none for this world size but the directory holds a complete checkpoint saved
  // by another number of ranks, FAILED_PRECONDITION on every rank (naming the iteration and both
  // sizes) instead of nullopt: starting from scratch would silently drop that run's progress.
  // Collective and blocking; a load failure on any rank is an error on every rank.
  StatusOr<std::optional<int64_t>> resume();

  // For a run that starts from scratch instead of calling resume(), before it does anything
  // else: FAILED_PRECONDITION on every rank when the directory holds any checkpoint of this name
  // (of any iteration and world size, on any rank's view of it), naming the directory, the
  // iterations and sizes and what to do; OK when there is none or no directory. Refusing there
  // costs nothing; save()'s own refusal (newer iterations only) would come after the work up to
  // the first checkpoint. Takes the directory's lock when the directory exists, like resume().
  // Collective and blocking (an allgather). save() keeps its refusal: files written after this
  // check are still never mixed in. `how_to_resume` completes "To continue that run, ..." in the
  // error (a job runner names its own switch).
  Status check_fresh_start(const std::string& how_to_resume = "call resume() instead");

  // For a run that starts from scratch in a directory that is its own (a restarted attempt of a
  // job whose restart policy does not resume, in the job's own directory): removes every
  // checkpoint file of this name that any rank sees (any iteration and world size), so this run's
  // saves are not refused and a later resume() loads only this run's. Returns how many files this
  // rank removed. Takes the directory's lock when the directory exists, like resume(), so an
  // earlier attempt still writing it is refused. Collective and blocking; a failure on any rank
  // is an error on every rank. Never for a directory other runs may share: check_fresh_start().
  StatusOr<int> start_over();

  // This rank's complete checkpoint files' iterations, ascending (local).
  StatusOr<std::vector<int64_t>> local_iterations() const;
  // The file of this rank for `iteration`.
  std::string path_for(int64_t iteration) const;
  // This rank's lock file in the directory.
  std::string lock_path() const;

 private:
  struct Entry;
  StatusOr<std::string> serialize(int64_t iteration) const;
  Status load_file(int64_t iteration);
  Status collect_garbage(int64_t saved);
  // Every checkpoint file of this name in the directory, any rank and world size (local).
  StatusOr<std::vector<CheckpointFile>> list_files() const;
  // This rank's iterations among `files`, ascending.
  std::vector<int64_t> own_iterations(const std::vector<CheckpointFile>& files) const;
  // OK once resume() or a save() has run; else FAILED_PRECONDITION when this rank's files hold
  // iterations newer than `iteration` (see save()).
  Status check_no_newer_run(int64_t iteration) const;
  // Takes this rank's lock on the directory (once; the directory must exist). FAILED_PRECONDITION
  // when another process holds it.
  Status lock_directory();
  // True on every rank iff `local` is OK on every rank (one allreduce MAX of a failure flag).
  Status agree(const Status& local, const char* what);

  std::string name_;
  comm::Communicator& comm_;
  std::string directory_;
  CheckpointerOptions options_;
  std::vector<std::shared_ptr<Entry>> entries_;
  int lock_fd_ = -1;  // the held lock file, or -1
  // True once resume() has looked at the directory or a save() has succeeded: newer files are
  // then this run's business (an incomplete set resume() skipped, or its own saves).
  bool directory_checked_ = false;
};

// ChainerMN's name for the constructor.
std::unique_ptr<MultiNodeCheckpointer> create_multi_node_checkpointer(const std::string& name,
                                                                      comm::Communicator& comm,
                                                                      const std::string& directory,
                                                                      CheckpointerOptions options = {});

}  // namespace cohort::train
