// Issue 5's checkpoint test with real processes: a 2-rank data-parallel run over UCX on 127.0.0.1
// is SIGKILLed (one rank) right after a checkpoint completes, the surviving rank fails with an
// error instead of hanging, the run is restarted from scratch (another initialization), resumes
// from the checkpoint and ends bit-identical to an uninterrupted run.
//
// What a checkpoint must carry for that, and where the run uses it: parameters and BatchNorm
// buffers (a module), SGD momentum (optimizer state), the default CPU generator (dropout masks),
// the iteration, and each rank's shuffled iterator position (mid-epoch).
//
// The parent never touches libtorch: each child builds its model, trains, and writes its final
// tensors to a file; the resumed run's children compare theirs with the uninterrupted run's files
// (at::equal) and fail naming the first tensor that differs.

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include "tests/comm/process_ranks.h"
#include "worker/comm/bootstrap.h"
#include "worker/comm/store/tcp_store.h"
#include "worker/comm/store/tcp_store_server.h"
#include "worker/train/multi_node_checkpointer.h"
#include "worker/train/multi_node_iterator.h"
#include "worker/train/multi_node_optimizer.h"
#include "worker/train/scatter_dataset.h"
#include "worker/train/synthetic_dataset.h"

namespace cohort::train {
namespace {

namespace fs = std::filesystem;
using comm::Duration;
using comm::testing::ProcessRanks;
using comm::testing::RankOutcome;
using std::chrono::seconds;

constexpr int kRanks = 2;
constexpr int kKilledRank = 1;
constexpr int64_t kSteps = 30;
constexpr int64_t kEvery = 4;       // checkpoint interval (iterations)
constexpr int64_t kKillAfter = 16;  // the checkpoint after which rank kKilledRank dies: mid-epoch
// Per collective: the survivor of the kill must fail within about twice this.
constexpr Duration kOpTimeout = seconds(4);
constexpr Duration kBootstrapTimeout = seconds(30);
// A whole run; children left past it are SIGKILLed and the test fails.
constexpr Duration kRunDeadline = seconds(90);

// 16 → 32 (BatchNorm) → dropout → 4: parameters, buffers and a random op.
class NetImpl : public torch::nn::Module {
 public:
  NetImpl()
      : fc1_(register_module("fc1", torch::nn::Linear(16, 32))),
        bn_(register_module("bn", torch::nn::BatchNorm1d(32))),
        fc2_(register_module("fc2", torch::nn::Linear(32, 4))) {}
  // Dropout draws from the default CPU generator: its state must be checkpointed.
  at::Tensor forward(const at::Tensor& x) {
    return fc2_->forward(at::dropout(at::relu(bn_->forward(fc1_->forward(x))), 0.2, is_training()));
  }

 private:
  torch::nn::Linear fc1_;
  torch::nn::BatchNorm1d bn_;
  torch::nn::Linear fc2_;
};
TORCH_MODULE(Net);

struct RunConfig {
  std::string name;                      // names the checkpoint and result files
  uint64_t init_seed = 1;                // model initialization (differs on the restart)
  bool resume = false;                   // resume from the newest common checkpoint
  int64_t kill_after = -1;               // kKilledRank SIGKILLs itself after this checkpoint
  std::optional<int64_t> expect_resume;  // the iteration resume() must return
  std::string compare_with;              // a run whose final tensors must equal ours bit for bit
};

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/cohort-train-process-test-XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string final_path(const std::string& dir, const std::string& run, int rank) {
  return dir + "/final_" + run + "_rank" + std::to_string(rank) + ".pt";
}

// Parameters then buffers, by name: what must be bit-identical.
std::vector<std::pair<std::string, at::Tensor>> final_tensors(Net& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model->named_parameters()) out.emplace_back(item.key(), item.value().detach());
  for (const auto& item : model->named_buffers()) out.emplace_back(item.key(), item.value().detach());
  return out;
}

Status compare_with_file(Net& model, const std::string& path) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  for (const auto& [name, mine] : final_tensors(model)) {
    at::Tensor theirs;
    archive.read(name, theirs);
    if (!at::equal(mine, theirs)) {
      double diff = mine.sizes() == theirs.sizes()
                        ? (mine.to(at::kDouble) - theirs.to(at::kDouble)).abs().max().item<double>()
                        : -1;
      return internal_error("{} differs from {} (max |diff| {})", name, path, diff);
    }
  }
  return ok_status();
}

// One rank of a run: train iterations [resume point, kSteps), checkpointing every kEvery.
Status train_rank(int rank, int port, const std::string& dir, const RunConfig& run) {
  at::set_num_threads(1);  // determinism, and two processes share the machine
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<comm::TcpStore> store,
                          comm::TcpStore::connect("127.0.0.1", port, kBootstrapTimeout));
  comm::Bootstrap boot;
  boot.store = std::move(store);
  boot.rank = rank;
  boot.world_size = kRanks;
  boot.node_id = "node0";
  COHORT_ASSIGN_OR_RETURN(auto world, comm::create_world(boot, kBootstrapTimeout));
  comm::CommunicatorOptions comm_options;
  comm_options.timeout = kOpTimeout;
  COHORT_ASSIGN_OR_RETURN(auto comm, comm::create_communicator("flat", world, comm_options));

  at::manual_seed(run.init_seed * 100 + static_cast<uint64_t>(rank));
  Net model;
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto optimizer = create_multi_node_optimizer(sgd, *comm);

  SyntheticDatasetOptions data_options;
  data_options.size = 200;
  data_options.sample_shape = {16};
  data_options.num_classes = 4;
  data_options.seed = 5;
  COHORT_ASSIGN_OR_RETURN(TensorDataset shard,
                          scatter_dataset(rank == 0 ? make_synthetic_dataset(data_options) : TensorDataset{},
                                          *comm, 0, /*shuffle=*/true, /*seed=*/11));
  // 100 samples per rank in batches of 16: 7 batches an epoch, the last one short.
  BatchIterator iterator(shard, 16, /*shuffle=*/true, /*seed=*/static_cast<uint64_t>(rank) + 1);

  auto checkpointer = create_multi_node_checkpointer("run", *comm, dir + "/ckpt_" + run.name);
  checkpointer->add_module("model", *model);
  checkpointer->add_optimizer("sgd", sgd);
  checkpointer->add_generator("default", at::detail::getDefaultCPUGenerator());
  checkpointer->add_iterator("train", iterator);
  int64_t start = 0;
  if (run.resume) {
    COHORT_ASSIGN_OR_RETURN(std::optional<int64_t> resumed, checkpointer->resume());
    if (resumed != run.expect_resume) {
      return internal_error("rank {} resumed at {}, expected {}", rank, resumed.value_or(-1),
                            run.expect_resume.value_or(-1));
    }
    start = resumed.value_or(0);
  }
  // Identity after a resume (the ranks' restored parameters agree); rank 0's on a fresh start.
  optimizer->broadcast_parameters();

  model->train();
  for (int64_t it = start; it < kSteps; ++it) {
    std::optional<TensorDataset> batch = iterator.next();
    if (!batch) batch = iterator.next();  // epoch boundary
    optimizer->zero_grad();
    at::nll_loss(at::log_softmax(model->forward(batch->inputs), 1), batch->targets).backward();
    optimizer->step();
    if ((it + 1) % kEvery == 0) {
      COHORT_RETURN_IF_ERROR(checkpointer->save(it + 1).with_context(fmt::format("checkpoint {}", it + 1)));
      // Every rank has reported its files complete: the fault lands after a finished checkpoint.
      if (it + 1 == run.kill_after && rank == kKilledRank) raise(SIGKILL);
    }
  }

  torch::serialize::OutputArchive out;
  for (const auto& [name, tensor] : final_tensors(model)) out.write(name, tensor);
  out.save_to(final_path(dir, run.name, rank));
  if (!run.compare_with.empty()) return compare_with_file(model, final_path(dir, run.compare_with, rank));
  return ok_status();
}

class CheckpointProcessTest : public ::testing::Test {
 protected:
  // Forks kRanks children running `run` on a fresh store; returns their outcomes.
  std::vector<RankOutcome> run_ranks(const RunConfig& run) {
    comm::TcpStoreServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    auto server = comm::TcpStoreServer::start(options);
    if (!server.ok()) {
      ADD_FAILURE() << "store server: " << server.status().to_string();
      return {};
    }
    int port = (*server)->port();
    std::string results = dir_.path() + "/results_" + run.name;
    fs::create_directories(results);
    ProcessRanks ranks(results);
    std::string dir = dir_.path();
    ranks.fork_ranks(kRanks, [&](int rank) -> Status {
      try {
        return train_rank(rank, port, dir, run);
      } catch (const std::exception& e) {
        return internal_error("rank {} threw: {}", rank, e.what());
      }
    });
    return ranks.wait_all(kRunDeadline);
  }

  std::vector<int64_t> checkpoint_iterations(const std::string& run, int rank) {
    std::vector<int64_t> out;
    std::string suffix = ".rank" + std::to_string(rank) + "of" + std::to_string(kRanks) + ".pt";
    for (const auto& entry : fs::directory_iterator(dir_.path() + "/ckpt_" + run)) {
      std::string file = entry.path().filename().string();
      if (file.size() > suffix.size() &&
          file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0) {
        out.push_back(std::stoll(file.substr(file.find(".iter") + 5, 12)));
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  TempDir dir_;
};

TEST_F(CheckpointProcessTest, KilledAndResumedRunEndsBitIdenticalToUninterrupted) {
  RunConfig uninterrupted{"a", 1, false, -1, std::nullopt, ""};
  EXPECT_EQ(comm::testing::failed_ranks(run_ranks(uninterrupted)), "");

  // Run B: rank 1 dies right after the checkpoint at kKillAfter; rank 0 must fail, not hang.
  RunConfig killed{"b", 1, false, kKillAfter, std::nullopt, ""};
  std::vector<RankOutcome> outcomes = run_ranks(killed);
  ASSERT_EQ(outcomes.size(), 2u);
  EXPECT_EQ(outcomes[kKilledRank].signal, SIGKILL) << outcomes[kKilledRank].message;
  const RankOutcome& survivor = outcomes[0];
  EXPECT_EQ(survivor.exit_code, 1) << "the survivor should fail with an error: " << survivor.message;
  EXPECT_NE(survivor.message.find("MultiNodeOptimizer"), std::string::npos) << survivor.message;
  EXPECT_LE(survivor.elapsed - outcomes[kKilledRank].elapsed, 2 * kOpTimeout + seconds(1))
      << "the survivor took too long to notice: " << survivor.message;
  // The checkpoint at kKillAfter is complete on both ranks and nothing later exists (GC kept
  // the previous generation too).
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(checkpoint_iterations("b", r), (std::vector<int64_t>{kKillAfter - kEvery, kKillAfter})) << r;
  }

  // Restart B from scratch with another initialization: it must resume at kKillAfter and end
  // exactly where A ended.
  RunConfig restarted{"b", 7, true, -1, kKillAfter, "a"};
  EXPECT_EQ(comm::testing::failed_ranks(run_ranks(restarted)), "");

  // Control: the restart's initialization without resuming ends elsewhere, so the comparison
  // above can fail.
  outcomes = run_ranks(RunConfig{"c", 7, false, -1, std::nullopt, "a"});
  ASSERT_EQ(outcomes.size(), 2u);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(outcomes[r].exit_code, 1) << "rank " << r;
    EXPECT_NE(outcomes[r].message.find("differs from"), std::string::npos) << outcomes[r].message;
  }
}

}  // namespace
}  // namespace cohort::train
