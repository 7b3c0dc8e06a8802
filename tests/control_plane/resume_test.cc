// Restart and resume end to end (issue 16), with the real cohort-worker under a live secure cluster
// (tests/control_plane/live_cluster.h: a coordinator and agents node-a and node-b):
//
// A graph job of 2 nodes x 1 rank with checkpoint.dir (every epoch), max_restarts: 2 and
// from_checkpoint: true trains next to an identical reference job that nobody touches. Once the
// first checkpoint of every rank is on disk, rank 1 is SIGKILLed in the middle of the next epoch.
// The job restarts (attempt 2), resumes from the newest checkpoint that EVERY rank has — a newer
// file that only rank 0 has, planted before the kill, must be passed over — and SUCCEEDS; its final
// checkpoint (parameters, buffers, optimizer state, iterator and RNG state) is bit for bit the
// uninterrupted reference run's, tensor by tensor.
//
// The checkpoint directories lie in a directory of the test's own that both agents share (as a
// cluster shares a file system) and that allowed_path_roots names, so a rank restarted on another
// node finds its files.

#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/serialize/input-archive.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "tests/control_plane/coordinator_calls.h"
#include "tests/control_plane/live_cluster.h"
#include "worker/base/status.h"

namespace cohort::daemon {
namespace {

using testing::kJobTimeout;
using testing::worker_pids;

namespace fs = std::filesystem;

// Epochs of the job: enough that a kill after the first checkpoint lands well before the end.
constexpr int kEpochs = 6;
// An iteration far beyond the job's last, for the file only rank 0 has.
constexpr int64_t kPlantedIteration = 999999999;
constexpr auto kCheckpointPoll = std::chrono::milliseconds(10);

// "<name>.iter<12 digits>.rank<r>of<n>.pt" (worker/train/multi_node_checkpointer.h).
struct CheckpointFile {
  int64_t iteration = 0;
  int rank = 0;
  fs::path path;
};

std::vector<CheckpointFile> checkpoint_files(const std::string& dir) {
  static const std::regex kPattern(R"(.*\.iter(\d{12})\.rank(\d+)of(\d+)\.pt)");
  std::vector<CheckpointFile> files;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, match, kPattern)) continue;
    files.push_back(CheckpointFile{std::stoll(match[1]), std::stoi(match[2]), entry.path()});
  }
  return files;
}

// The newest iteration for which every one of `ranks` ranks has a file, if any.
std::optional<int64_t> newest_common(const std::vector<CheckpointFile>& files, int ranks) {
  std::map<int64_t, int> count;
  for (const CheckpointFile& file : files) ++count[file.iteration];
  std::optional<int64_t> newest;
  for (const auto& item : count) {
    if (item.second == ranks) newest = item.first;
  }
  return newest;
}

// Every tensor of archive `a` (parameters, buffers, optimizer state such as momentum, the iterator's
// and RNG state, section by section) equals b's under the same name, bit for bit (at::equal: same
// shape and dtype, equal elements); the number of tensors compared, or an error naming the first
// difference. Not the files' bytes: TorchScript names the archive's sections with a per-process
// counter, so two processes write equal states as different bytes.
// The tensors of one section, in order (for state sections named by address).
std::vector<at::Tensor> section_tensors(torch::serialize::InputArchive& archive) {
  std::vector<at::Tensor> tensors;
  for (const std::string& key : archive.keys()) {
    at::Tensor tensor;
    if (archive.try_read(key, tensor) || archive.try_read(key, tensor, /*is_buffer=*/true)) tensors.push_back(tensor);
  }
  return tensors;
}

bool all_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes() || !at::equal(a[i], b[i])) return false;
  }
  return true;
}

StatusOr<int> compare_archives(torch::serialize::InputArchive& a, torch::serialize::InputArchive& b,
                               const std::string& where) {
  // Sections and tensors pair up in order, except that libtorch's optimizers name a parameter's
  // state after its address in the writing process ("state.0x55d0..."), which also orders them:
  // those sections are matched as a set (each must equal a distinct one of the reference's).
  const std::vector<std::string> keys_a = a.keys();
  const std::vector<std::string> keys_b = b.keys();
  if (keys_a.size() != keys_b.size())
    return internal_error("{}: {} entries vs {} in the reference", where, keys_a.size(), keys_b.size());
  int compared = 0;
  std::vector<std::vector<at::Tensor>> by_address_a;
  std::vector<std::vector<at::Tensor>> by_address_b;
  for (size_t i = 0; i < keys_a.size(); ++i) {
    const std::string& key = keys_a[i];
    const std::string& key_b = keys_b[i];
    const std::string name = where.empty() ? key : where + "." + key;
    if (key != key_b && !(key.rfind("0x", 0) == 0 && key_b.rfind("0x", 0) == 0))
      return internal_error("{}: entry {} is {} in the reference", name, i, key_b);
    torch::serialize::InputArchive sub_a;
    torch::serialize::InputArchive sub_b;
    if (key.rfind("0x", 0) == 0 && a.try_read(key, sub_a) && b.try_read(key_b, sub_b)) {
      by_address_a.push_back(section_tensors(sub_a));
      by_address_b.push_back(section_tensors(sub_b));
      continue;
    }
    if (a.try_read(key, sub_a)) {
      if (!b.try_read(key_b, sub_b)) return internal_error("section {} is missing in the reference", name);
      COHORT_ASSIGN_OR_RETURN(int inner, compare_archives(sub_a, sub_b, name));
      compared += inner;
      continue;
    }
    at::Tensor mine;
    at::Tensor theirs;
    if (a.try_read(key, mine) || a.try_read(key, mine, /*is_buffer=*/true)) {
      if (!b.try_read(key_b, theirs) && !b.try_read(key_b, theirs, /*is_buffer=*/true))
        return internal_error("tensor {} is missing in the reference", name);
      if (!at::equal(mine, theirs)) {
        const double diff = mine.sizes() == theirs.sizes()
                                ? (mine.to(at::kDouble) - theirs.to(at::kDouble)).abs().max().item<double>()
                                : -1;
        return internal_error("tensor {} differs (max |diff| {})", name, diff);
      }
      ++compared;
    }
  }
  std::vector<bool> used(by_address_b.size(), false);
  for (const std::vector<at::Tensor>& mine : by_address_a) {
    bool matched = false;
    for (size_t j = 0; j < by_address_b.size() && !matched; ++j) {
      if (!used[j] && all_equal(mine, by_address_b[j])) used[j] = matched = true;
    }
    if (!matched) return internal_error("{}: a parameter's state has no bit-identical counterpart", where);
    compared += static_cast<int>(mine.size());
  }
  return compared;
}

// Compares two checkpoint files (see compare_archives) and their iteration.
StatusOr<int> compare_checkpoints(const fs::path& mine, const fs::path& reference) {
  try {
    torch::serialize::InputArchive a;
    torch::serialize::InputArchive b;
    a.load_from(mine.string());
    b.load_from(reference.string());
    c10::IValue iteration_a;
    c10::IValue iteration_b;
    a.read("iteration", iteration_a);
    b.read("iteration", iteration_b);
    if (iteration_a.toInt() != iteration_b.toInt())
      return internal_error("iteration {} vs {}", iteration_a.toInt(), iteration_b.toInt());
    return compare_archives(a, b, "");
  } catch (const std::exception& e) {
    return internal_error("reading {} / {}: {}", mine.string(), reference.string(), e.what());
  }
}

class ResumeTest : public testing::LiveClusterTest {
 protected:
  void SetUp() override {
    // The job's user must create files in the checkpoint directories.
    const passwd* user = getpwnam(job_user_.c_str());
    ASSERT_NE(user, nullptr) << "no Unix user " << job_user_ << " (deploy/install-deps.sh creates it)";
    for (const char* name : {"interrupted", "reference"}) {
      const std::string dir = shared_.path() + "/" + name;
      ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
      ASSERT_EQ(chown(dir.c_str(), user->pw_uid, user->pw_gid), 0) << dir;
    }
    testing::LiveClusterTest::SetUp();
  }
  void configure_coordinator(DaemonServerOptions& options) override {
    options.allowed_path_roots = {shared_.path()};
  }
  void configure_agent(DaemonServerOptions& options) override {
    options.allowed_path_roots = {shared_.path()};
    // One slot per job per node: the restart waits for the killed attempt's ranks to drain, so two
    // attempts never overlap (the checkpoint directory's lock would fail the second).
    options.slots = 2;
    job_user_ = options.job_user;
  }

  cohort::v1::JobSpec resumable_job(const std::string& name, const std::string& checkpoint_dir) {
    cohort::v1::JobSpec spec;
    spec.set_name(name);
    spec.set_nodes(2);
    spec.set_procs_per_node(1);
    spec.set_communicator("flat");
    cohort::v1::Dataset* dataset = spec.mutable_dataset();
    dataset->set_kind(cohort::v1::SYNTHETIC);
    dataset->set_train_size(2048);
    dataset->set_test_size(64);
    dataset->add_input_shape(32);
    dataset->set_num_classes(4);
    cohort::v1::Graph* graph = spec.mutable_data_parallel()->mutable_graph();
    for (auto [in, out] : {std::pair<int, int>{32, 16}, {16, 4}}) {
      cohort::v1::Layer* layer = graph->add_layers();
      layer->set_type("linear");
      layer->set_in_features(in);
      layer->set_out_features(out);
      if (in == 32) graph->add_layers()->set_type("relu");
    }
    spec.set_loss("cross_entropy");
    spec.mutable_optimizer()->set_kind(cohort::v1::MOMENTUM);
    spec.mutable_optimizer()->set_lr(0.05);
    spec.mutable_optimizer()->set_momentum(0.9);
    spec.set_batch_size(8);
    spec.set_epochs(kEpochs);
    spec.set_seed(11);
    spec.mutable_checkpoint()->set_dir(checkpoint_dir);
    spec.mutable_checkpoint()->set_interval_epochs(1);
    spec.mutable_restart_policy()->set_max_restarts(2);
    spec.mutable_restart_policy()->set_from_checkpoint(true);
    return spec;
  }

  std::string read_attempt_log(const cohort::v1::JobRecord& job, int rank, int attempt) {
    cohort::v1::StreamLogsRequest request;
    request.set_job_id(job.id());
    request.set_rank(rank);
    request.set_attempt(attempt);
    grpc::ClientContext context;
    testing::set_deadline(&context);
    auto reader = stub_->StreamLogs(&context, request);
    std::string text;
    cohort::v1::LogChunk chunk;
    while (reader->Read(&chunk)) text += chunk.data();
    grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return text;
  }

  coordinator::testing::TempDir shared_;
  std::string job_user_ = "cohort-job";
};

TEST_F(ResumeTest, ARankKilledMidEpochResumesFromTheNewestCommonCheckpointAndEndsBitIdentical) {
  const std::string interrupted_dir = shared_.path() + "/interrupted";
  const std::string reference_dir = shared_.path() + "/reference";
  const std::string id = submit(resumable_job("resume", interrupted_dir));
  const std::string reference = submit(resumable_job("reference", reference_dir));
  ASSERT_FALSE(id.empty());
  ASSERT_FALSE(reference.empty());

  // The first checkpoint of both ranks is on disk: the ranks are now in the next epoch.
  std::optional<int64_t> first;
  const auto give_up = std::chrono::steady_clock::now() + kJobTimeout;
  while (!first && std::chrono::steady_clock::now() < give_up) {
    first = newest_common(checkpoint_files(interrupted_dir), 2);
    if (!first) std::this_thread::sleep_for(kCheckpointPoll);
  }
  ASSERT_TRUE(first.has_value()) << "no checkpoint of both ranks within the job timeout: " << get_job(id).reason();
  std::vector<pid_t> victims = worker_pids(id, /*rank=*/1);
  ASSERT_EQ(victims.size(), 1u);

  // A newer checkpoint that only rank 0 has (what a rank killed in the middle of a save leaves):
  // a resume that took rank 0's newest instead of the newest common one would load it.
  for (const CheckpointFile& file : checkpoint_files(interrupted_dir)) {
    if (file.rank != 0 || file.iteration != *first) continue;
    std::string planted = file.path.string();
    planted.replace(planted.find(".iter") + 5, 12, fmt::format("{:012d}", kPlantedIteration));
    fs::copy_file(file.path, planted);
  }
  ASSERT_EQ(kill(victims[0], SIGKILL), 0);
  // Once rank 1 is gone its files are final, so the newest common checkpoint is fixed now: rank 0
  // may still write a newer one of its own, but rank 1 will never have it.
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!worker_pids(id, 1).empty() && std::chrono::steady_clock::now() < gone_by)
    std::this_thread::sleep_for(kCheckpointPoll);
  std::vector<CheckpointFile> rank1_files;
  for (const CheckpointFile& file : checkpoint_files(interrupted_dir)) {
    if (file.rank == 1) rank1_files.push_back(file);
  }
  ASSERT_FALSE(rank1_files.empty());
  const int64_t newest_of_rank1 =
      std::max_element(rank1_files.begin(), rank1_files.end(), [](const auto& a, const auto& b) {
        return a.iteration < b.iteration;
      })->iteration;

  cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.attempt(), 2) << "the kill must cost exactly one restart";
  cohort::v1::JobRecord straight = wait_for_state(reference, cohort::v1::SUCCEEDED);
  ASSERT_EQ(straight.state(), cohort::v1::SUCCEEDED) << straight.reason();
  EXPECT_EQ(straight.attempt(), 1);

  // Attempt 2 resumed from the newest checkpoint both ranks had — rank 1's newest (rank 0 saves
  // whenever rank 1 does) — not from the planted file that only rank 0 has.
  const std::string log = read_attempt_log(job, 0, job.attempt());
  std::smatch match;
  ASSERT_TRUE(std::regex_search(log, match, std::regex(R"(resumed from the checkpoint of step (\d+))"))) << log;
  const int64_t resumed = std::stoll(match[1]);
  EXPECT_NE(resumed, kPlantedIteration) << "resumed from the file only rank 0 had";
  EXPECT_EQ(resumed, newest_of_rank1) << "not the newest checkpoint that every rank had";
  EXPECT_GE(resumed, *first);

  // The final checkpoint (the last epoch's) of each rank: byte for byte the reference run's.
  std::map<int, CheckpointFile> final_reference;
  for (const CheckpointFile& file : checkpoint_files(reference_dir)) {
    if (final_reference.count(file.rank) == 0 || final_reference[file.rank].iteration < file.iteration)
      final_reference[file.rank] = file;
  }
  ASSERT_EQ(final_reference.size(), 2u);
  EXPECT_GT(final_reference[0].iteration, resumed) << "the resumed run trained no further";
  for (const auto& item : final_reference) {
    const CheckpointFile& expected = item.second;
    std::optional<CheckpointFile> actual;
    for (const CheckpointFile& file : checkpoint_files(interrupted_dir)) {
      if (file.rank == expected.rank && file.iteration == expected.iteration) actual = file;
    }
    ASSERT_TRUE(actual.has_value()) << "rank " << expected.rank << " has no checkpoint of step "
                                    << expected.iteration << " in " << interrupted_dir;
    StatusOr<int> compared = compare_checkpoints(actual->path, expected.path);
    ASSERT_TRUE(compared.ok()) << "rank " << expected.rank << ": the final checkpoint of step "
                               << expected.iteration << " differs from the uninterrupted run's: "
                               << compared.status().to_string();
    // Parameters (4: two linear layers' weights and biases) and optimizer state at least.
    EXPECT_GE(*compared, 4) << "rank " << expected.rank;
    std::printf("resume_test: rank %d: %d tensors of the final checkpoint (step %lld) bit-identical\n",
                expected.rank, *compared, static_cast<long long>(expected.iteration));
  }
}

}  // namespace
}  // namespace cohort::daemon
