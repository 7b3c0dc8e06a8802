#include "worker/train/multi_node_checkpointer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <vector>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/train/multi_node_optimizer.h"
#include "worker/train/synthetic_dataset.h"

namespace cohort::train {
namespace {

namespace fs = std::filesystem;

template <typename Fn>
std::string run_on_ranks(int size, Fn fn) {
  auto worlds = comm::testing::loopback_worlds(size);
  comm::CommunicatorOptions options;
  options.timeout = std::chrono::seconds(20);
  return comm::testing::failures(comm::testing::run_ranks(size, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, comm::create_communicator("flat", worlds[rank], options));
    return fn(rank, *comm);
  }));
}

// A fresh directory under the test's temp dir.
std::string fresh_dir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(root != nullptr ? root : "/tmp") / name;
  fs::remove_all(dir);
  return dir.string();
}

constexpr int kRanks = 2;
constexpr int64_t kSteps = 6;       // k
constexpr int64_t kCheckpoint = 3;  // j

// One rank's training run: a linear classifier, SGD with momentum (optimizer state) behind the
// multi-node optimizer, a per-rank generator adding input noise (RNG state), a synchronized
// shuffled iterator (position). Runs iterations [resume point, stop), checkpointing at
// kCheckpoint. `init_seed` differs between a first run and a restart, so a restart that did not
// restore would show.
struct RankRun {
  int64_t stop = kSteps;
  uint64_t init_seed = 1;
  bool resume = false;
};

StatusOr<std::vector<at::Tensor>> train(int rank, comm::Communicator& comm, const std::string& dir,
                                        const RankRun& run, std::optional<int64_t>* resumed_at) {
  at::Generator init = at::detail::createCPUGenerator(run.init_seed * 100 + rank);
  torch::nn::Linear model(8, 4);
  {
    torch::NoGradGuard no_grad;
    model->weight.normal_(0, 0.3, init);
    model->bias.normal_(0, 0.1, init);
  }
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  MultiNodeOptimizerOptions options;
  options.overlap = false;
  auto optimizer = create_multi_node_optimizer(sgd, comm, options);
  SyntheticDatasetOptions data_options;
  data_options.size = 20;
  data_options.sample_shape = {8};
  data_options.num_classes = 4;
  data_options.seed = static_cast<uint64_t>(rank);
  COHORT_ASSIGN_OR_RETURN(auto iterator,
                          create_synchronized_iterator(make_synthetic_dataset(data_options), 6, comm,
                                                       /*seed=*/42));
  at::Generator noise = at::detail::createCPUGenerator(run.init_seed * 1000 + rank);

  auto checkpointer = create_multi_node_checkpointer("test", comm, dir);
  checkpointer->add_module("model", *model);
  checkpointer->add_optimizer("sgd", sgd);
  checkpointer->add_iterator("train", *iterator);
  checkpointer->add_generator("noise", noise);
  int64_t start = 0;
  if (run.resume) {
    COHORT_ASSIGN_OR_RETURN(*resumed_at, checkpointer->resume());
    start = resumed_at->value_or(0);
  }
  for (int64_t it = start; it < run.stop; ++it) {
    std::optional<TensorDataset> batch = iterator->next();
    if (!batch) batch = iterator->next();  // epoch boundary
    at::Tensor x = batch->inputs + 0.01 * at::randn(batch->inputs.sizes(), noise);
    optimizer->zero_grad();
    at::nll_loss(at::log_softmax(model->forward(x), 1), batch->targets).backward();
    optimizer->step();
    if (it + 1 == kCheckpoint) COHORT_RETURN_IF_ERROR(checkpointer->save(it + 1));
  }
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

// The checkpoint test: a 2-rank run checkpointed at step j and killed later, restarted
// from scratch (different initialization), ends bit-identical to an uninterrupted run.
TEST(MultiNodeCheckpointerTest, ResumedRunIsBitIdentical) {
  at::set_num_threads(1);
  std::mutex mu;
  std::vector<std::vector<at::Tensor>> reference(kRanks), resumed(kRanks);
  std::string dir_a = fresh_dir("uninterrupted"), dir_b = fresh_dir("interrupted");

  ASSERT_EQ(run_on_ranks(kRanks,
                         [&](int rank, comm::Communicator& comm) -> Status {
                           std::optional<int64_t> unused;
                           COHORT_ASSIGN_OR_RETURN(auto params, train(rank, comm, dir_a, RankRun{}, &unused));
                           std::lock_guard<std::mutex> lock(mu);
                           reference[rank] = params;
                           return ok_status();
                         }),
            "");
  // Killed after step j+1: the work after the checkpoint is lost.
  ASSERT_EQ(
      run_on_ranks(kRanks,
                   [&](int rank, comm::Communicator& comm) -> Status {
                     std::optional<int64_t> unused;
                     return train(rank, comm, dir_b, RankRun{kCheckpoint + 1, 1, false}, &unused).status();
                   }),
      "");
  ASSERT_EQ(run_on_ranks(kRanks,
                         [&](int rank, comm::Communicator& comm) -> Status {
                           std::optional<int64_t> resumed_at;
                           COHORT_ASSIGN_OR_RETURN(
                               auto params, train(rank, comm, dir_b, RankRun{kSteps, 7, true}, &resumed_at));
                           if (resumed_at != std::optional<int64_t>(kCheckpoint)) {
                             return internal_error("rank {} resumed at {}", rank, resumed_at.value_or(-1));
                           }
                           std::lock_guard<std::mutex> lock(mu);
                           resumed[rank] = params;
                           return ok_status();
                         }),
            "");
  // Control: the restart's own initialization, not resumed, ends elsewhere.
  std::vector<at::Tensor> fresh;
  ASSERT_EQ(run_on_ranks(kRanks,
                         [&](int rank, comm::Communicator& comm) -> Status {
                           std::optional<int64_t> unused;
                           COHORT_ASSIGN_OR_RETURN(
                               auto params, train(rank, comm, fresh_dir("fresh" + std::to_string(rank)),
                                                  RankRun{kSteps, 7, false}, &unused));
                           std::lock_guard<std::mutex> lock(mu);
                           if (rank == 0) fresh = params;
                           return ok_status();
                         }),
            "");
  EXPECT_FALSE(at::equal(fresh[0], reference[0][0]));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(reference[r].size(), resumed[r].size());
    for (size_t i = 0; i < reference[r].size(); ++i) {
      EXPECT_TRUE(at::equal(reference[r][i], resumed[r][i])) << "rank " << r << " parameter " << i;
    }
    EXPECT_TRUE(at::equal(reference[r][0], reference[0][0]));  // data parallel: ranks agree
  }
}

// resume() picks the newest iteration every rank has, and GC keeps keep_generations per rank.
TEST(MultiNodeCheckpointerTest, ResumesNewestCommonIterationAndCollectsGarbage) {
  for (int size = 1; size <= 4; ++size) {
    std::string dir = fresh_dir("common" + std::to_string(size));
    std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      at::Tensor value = at::zeros({3});
      CheckpointerOptions options;
      options.keep_generations = 2;
      auto checkpointer = create_multi_node_checkpointer("gc", comm, dir, options);
      checkpointer->add_tensors("value", {value});
      COHORT_ASSIGN_OR_RETURN(auto none, checkpointer->resume());
      if (none.has_value()) return internal_error("resumed {} from an empty directory", *none);
      for (int64_t it : {10, 20, 30}) {
        value.fill_(double(it + rank));
        COHORT_RETURN_IF_ERROR(checkpointer->save(it));
      }
      COHORT_ASSIGN_OR_RETURN(auto kept, checkpointer->local_iterations());
      if (kept != std::vector<int64_t>{20, 30})
        return internal_error("rank {} kept {} files", rank, kept.size());
      // The last rank's newest file is lost (a crash before its rename): every rank resumes at 20.
      COHORT_RETURN_IF_ERROR(comm.barrier(comm::CallOptions{std::nullopt, true})->wait());
      if (rank == size - 1) fs::remove(checkpointer->path_for(30));
      COHORT_RETURN_IF_ERROR(comm.barrier(comm::CallOptions{std::nullopt, true})->wait());
      value.fill_(-1);
      COHORT_ASSIGN_OR_RETURN(auto at, checkpointer->resume());
      if (at != std::optional<int64_t>(20) || value[0].item<float>() != 20 + rank) {
        return internal_error("rank {} resumed at {} with value {}", rank, at.value_or(-1),
                              value[0].item<float>());
      }
      return ok_status();
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

// Issue 16: while one attempt's checkpointer holds the directory, a second one (an old attempt still
// running on a partitioned node, and its restart) can neither save nor resume there, on any rank,
// and its error names the lock and its holder; once the first is gone, the second goes on.
TEST(MultiNodeCheckpointerTest, TwoAttemptsNeverWriteOneDirectoryAtOnce) {
  std::string dir = fresh_dir("locked");
  std::string failures = run_on_ranks(kRanks, [&](int rank, comm::Communicator& comm) -> Status {
    at::Tensor value = at::zeros({2});
    auto first = create_multi_node_checkpointer("job", comm, dir);
    first->add_tensors("value", {value});
    COHORT_RETURN_IF_ERROR(first->save(1));
    auto second = create_multi_node_checkpointer("job", comm, dir);
    second->add_tensors("value", {value});
    Status refused = second->save(2);
    if (refused.code() != StatusCode::kFailedPrecondition ||
        refused.message().find(second->lock_path()) == std::string::npos ||
        refused.message().find(fmt::format("pid {}", ::getpid())) == std::string::npos) {
      return internal_error("rank {}: a second writer was not refused clearly: {}", rank, refused.to_string());
    }
    auto resumed = second->resume();
    if (resumed.ok()) return internal_error("rank {}: the second attempt resumed from a directory in use", rank);
    COHORT_ASSIGN_OR_RETURN(auto kept, first->local_iterations());
    if (kept != std::vector<int64_t>{1}) return internal_error("rank {}: the refused save wrote a file", rank);
    first.reset();  // the first attempt ends (or dies): its lock goes with it
    COHORT_RETURN_IF_ERROR(comm.barrier(comm::CallOptions{std::nullopt, true})->wait());
    COHORT_ASSIGN_OR_RETURN(auto at, second->resume());
    if (at != std::optional<int64_t>(1)) return internal_error("rank {}: resumed at {}", rank, at.value_or(-1));
    return second->save(2);
  });
  EXPECT_EQ(failures, "");
}

// A checkpoint saved by 2 ranks, resumed by 3 or by 1: every rank fails with FAILED_PRECONDITION
// naming the directory, the iteration and both sizes — not nullopt, which a job takes as "no
// checkpoint" and trains from step 0 beside the old run's files.
TEST(MultiNodeCheckpointerTest, ResumeAtAnotherWorldSizeFailsOnEveryRank) {
  std::string dir = fresh_dir("resize");
  ASSERT_EQ(run_on_ranks(2,
                         [&](int rank, comm::Communicator& comm) -> Status {
                           at::Tensor value = at::full({2}, double(rank));
                           auto checkpointer = create_multi_node_checkpointer("resize", comm, dir);
                           checkpointer->add_tensors("value", {value});
                           COHORT_RETURN_IF_ERROR(checkpointer->save(40));
                           return checkpointer->save(50);
                         }),
            "");
  for (int size : {3, 1}) {
    std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      at::Tensor value = at::zeros({2});
      auto checkpointer = create_multi_node_checkpointer("resize", comm, dir);
      checkpointer->add_tensors("value", {value});
      auto resumed = checkpointer->resume();
      const std::string expected = fmt::format(
          "{} holds a complete checkpoint of iteration 50 saved by 2 ranks, "
          "but this run has {} ranks",
          dir, size);
      if (resumed.ok() || resumed.status().code() != StatusCode::kFailedPrecondition ||
          resumed.status().message().find(expected) == std::string::npos) {
        return internal_error("rank {} of {}: expected FAILED_PRECONDITION with \"{}\", got {}", rank, size,
                              expected, resumed.ok() ? "a resume" : resumed.status().to_string());
      }
      return ok_status();
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
  // The 2-rank run itself still resumes.
  EXPECT_EQ(run_on_ranks(2,
                         [&](int rank, comm::Communicator& comm) -> Status {
                           at::Tensor value = at::zeros({2});
                           auto checkpointer = create_multi_node_checkpointer("resize", comm, dir);
                           checkpointer->add_tensors("value", {value});
                           COHORT_ASSIGN_OR_RETURN(auto at, checkpointer->resume());
                           if (at != std::optional<int64_t>(50) || value[0].item<float>() != rank)
                             return internal_error("rank {}: resumed at {}", rank, at.value_or(-1));
                           return ok_status();
                         }),
            "");
}

// The directory holds iterations 50 and 60 of an older run. A new run that did not resume() is
// refused its save(10), naming them (garbage collection used to delete the file just written —
// the oldest of 10, 50, 60 — and a later resume() loaded the old run's 60). After a resume() that
// found them incomplete (rank 1 lost its files), save(10) keeps 10 and collects nothing newer.
TEST(MultiNodeCheckpointerTest, SaveNeverCollectsTheIterationJustSaved) {
  std::string dir = fresh_dir("older_run");
  ASSERT_EQ(run_on_ranks(kRanks,
                         [&](int rank, comm::Communicator& comm) -> Status {
                           at::Tensor value = at::zeros({2});
                           auto old_run = create_multi_node_checkpointer("job", comm, dir);
                           old_run->add_tensors("value", {value});
                           COHORT_RETURN_IF_ERROR(old_run->save(50));
                           return old_run->save(60);
                         }),
            "");
  std::string failures = run_on_ranks(kRanks, [&](int rank, comm::Communicator& comm) -> Status {
    at::Tensor value = at::zeros({2});
    auto checkpointer = create_multi_node_checkpointer("job", comm, dir);
    checkpointer->add_tensors("value", {value});
    Status refused = checkpointer->save(10);
    if (refused.code() != StatusCode::kFailedPrecondition ||
        refused.message().find("iterations 50,60, newer than the iteration 10") == std::string::npos) {
      return internal_error("rank {}: save(10) beside iterations 50 and 60 was not refused: {}", rank,
                            refused.to_string());
    }
    COHORT_ASSIGN_OR_RETURN(auto kept, checkpointer->local_iterations());
    if (kept != std::vector<int64_t>{50, 60})
      return internal_error("rank {}: {} files after the refusal", rank, kept.size());
    return ok_status();
  });
  EXPECT_EQ(failures, "");

  failures = run_on_ranks(kRanks, [&](int rank, comm::Communicator& comm) -> Status {
    at::Tensor value = at::zeros({2});
    auto checkpointer = create_multi_node_checkpointer("job", comm, dir);
    checkpointer->add_tensors("value", {value});
    if (rank == 1) {
      fs::remove(checkpointer->path_for(50));
      fs::remove(checkpointer->path_for(60));
    }
    COHORT_RETURN_IF_ERROR(comm.barrier(comm::CallOptions{std::nullopt, true})->wait());
    COHORT_ASSIGN_OR_RETURN(auto at, checkpointer->resume());
    if (at.has_value()) return internal_error("rank {}: resumed at {}", rank, *at);
    COHORT_RETURN_IF_ERROR(checkpointer->save(10));
    if (!fs::exists(checkpointer->path_for(10)))
      return internal_error("rank {}: save(10) deleted its own file", rank);
    COHORT_ASSIGN_OR_RETURN(auto kept, checkpointer->local_iterations());
    std::vector<int64_t> expected = rank == 0 ? std::vector<int64_t>{10, 50, 60} : std::vector<int64_t>{10};
    if (kept != expected) return internal_error("rank {}: kept {} files", rank, kept.size());
    value.fill_(-1);
    COHORT_ASSIGN_OR_RETURN(at, checkpointer->resume());
    if (at != std::optional<int64_t>(10))
      return internal_error("rank {}: resumed at {}", rank, at.value_or(-1));
    return ok_status();
  });
  EXPECT_EQ(failures, "");
}

// A run that starts from scratch asks check_fresh_start() first: OK without checkpoints of its
// name (no directory, or only other names' files), FAILED_PRECONDITION on every rank — naming the
// directory, the iterations and the world sizes that saved them — when any rank sees any checkpoint
// of its name: older or newer than what it would save, of its own size or another, or only in rank
// 0's node-local directory (rank 1's is empty, and still fails instead of going on alone).
TEST(MultiNodeCheckpointerTest, CheckFreshStartRefusesAnyCheckpointOfItsNameOnEveryRank) {
  const std::string absent = fresh_dir("fresh_absent");
  const std::string same_size = fresh_dir("fresh_same_size");
  const std::string other_size = fresh_dir("fresh_other_size");
  const std::string local0 = fresh_dir("fresh_local0"), local1 = fresh_dir("fresh_local1");
  auto save = [](int size, const std::string& name, std::function<std::string(int)> dir_of,
                 std::vector<int64_t> iterations) {
    return run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      at::Tensor value = at::zeros({2});
      auto checkpointer = create_multi_node_checkpointer(name, comm, dir_of(rank));
      checkpointer->add_tensors("value", {value});
      for (int64_t i : iterations) COHORT_RETURN_IF_ERROR(checkpointer->save(i));
      return ok_status();
    });
  };
  ASSERT_EQ(save(kRanks, "other", [&](int) { return absent; }, {70}), "");  // another name only
  ASSERT_EQ(save(kRanks, "job", [&](int) { return same_size; }, {40, 50}), "");
  ASSERT_EQ(save(1, "job", [&](int) { return other_size; }, {30}), "");
  ASSERT_EQ(save(kRanks, "job", [&](int rank) { return rank == 0 ? local0 : local1; }, {20}), "");
  fs::remove(fs::path(local1) / "job.iter000000000020.rank1of2.pt");

  // dir_of(rank) -> what every rank's check must say ("" for OK).
  auto check = [&](std::function<std::string(int)> dir_of, const std::string& expected) {
    return run_on_ranks(kRanks, [&](int rank, comm::Communicator& comm) -> Status {
      auto checkpointer = create_multi_node_checkpointer("job", comm, dir_of(rank));
      Status checked = checkpointer->check_fresh_start();
      if (expected.empty()) return checked;
      if (checked.code() != StatusCode::kFailedPrecondition ||
          checked.message().find(expected) == std::string::npos) {
        return internal_error("rank {}: expected FAILED_PRECONDITION with \"{}\", got {}", rank, expected,
                              checked.to_string());
      }
      return ok_status();
    });
  };
  EXPECT_EQ(check([&](int) { return absent + "/never_created"; }, ""), "");
  EXPECT_EQ(check([&](int) { return absent; }, ""), "");
  EXPECT_EQ(check([&](int) { return same_size; },
                  fmt::format("the checkpoint directory {} already holds checkpoints of job: iterations 40, "
                              "50 saved by 2 ranks. Saving beside them would mix two runs",
                              same_size)),
            "");
  EXPECT_EQ(check([&](int) { return same_size; },
                  "To continue that run, call resume() instead; to start a "
                  "new one, use another checkpoint directory or remove " +
                      same_size + "/job.iter*.pt"),
            "");
  EXPECT_EQ(check([&](int) { return other_size; }, "holds checkpoints of job: iteration 30 saved by 1 rank."),
            "");
  EXPECT_EQ(check([&](int rank) { return rank == 0 ? local0 : local1; },
                  "holds checkpoints of job: iteration 20 saved by 2 ranks."),
            "");
  // It looked only: nothing was written or removed.
  EXPECT_TRUE(fs::exists(fs::path(same_size) / "job.iter000000000050.rank1of2.pt"));
  EXPECT_TRUE(fs::exists(fs::path(other_size) / "job.iter000000000030.rank0of1.pt"));
  EXPECT_FALSE(fs::exists(absent + "/never_created"));
}

// An iterator restored under another shuffle seed would continue with other samples: refused on
// every rank.
TEST(MultiNodeCheckpointerTest, IteratorSeedMismatchFailsEveryRank) {
  std::string dir = fresh_dir("seed");
  TensorDataset data = make_synthetic_dataset();
  std::string failures = run_on_ranks(2, [&](int rank, comm::Communicator& comm) -> Status {
    BatchIterator saved(data, 8, true, 1);
    auto writer = create_multi_node_checkpointer("seed", comm, dir);
    writer->add_iterator("train", saved);
    COHORT_RETURN_IF_ERROR(writer->save(5));
    BatchIterator other(data, 8, true, rank == 0 ? 1 : 2);
    auto reader = create_multi_node_checkpointer("seed", comm, dir);
    reader->add_iterator("train", other);
    auto resumed = reader->resume();
    if (resumed.ok()) return internal_error("rank {} resumed despite rank 1's seed mismatch", rank);
    return ok_status();
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace cohort::train
