#include "worker/runner/job_runner.h"

#include <ATen/Parallel.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/runner/job_spec_file.h"

namespace cohort::worker {
namespace {

namespace fs = std::filesystem;

// A learnable 4-class problem on 8×8 inputs and an MLP for it: trains in well under a second.
constexpr const char* kDataParallelSpec = R"pb(
  name: "tiny"
  dataset {
    kind: SYNTHETIC
    train_size: 1024
    test_size: 128
    input_shape: [ 1, 8, 8 ]
    num_classes: 4
  }
  data_parallel {
    graph {
      layers { type: "flatten" }
      layers { type: "linear" in_features: 64 out_features: 32 }
      layers { type: "relu" }
      layers { type: "linear" in_features: 32 out_features: 4 }
    }
  }
  loss: "cross_entropy"
  optimizer { kind: MOMENTUM lr: 0.1 momentum: 0.9 }
  batch_size: 16
  epochs: 3
  seed: 7
)pb";

// The same MLP cut into three stages: rank 0 → rank 1 → rank 2 (loss on rank 2).
constexpr const char* kModelParallelSpec = R"pb(
  name: "tiny-mp"
  dataset {
    kind: SYNTHETIC
    train_size: 1024
    test_size: 128
    input_shape: [ 1, 8, 8 ]
    num_classes: 4
  }
  model_parallel {
    stages {
      rank: 0
      rank_out: [ 1 ]
      graph {
        layers { type: "flatten" }
        layers { type: "linear" in_features: 64 out_features: 32 }
        layers { type: "relu" }
      }
    }
    stages {
      rank: 1
      rank_in: [ 0 ]
      rank_out: [ 2 ]
      graph {
        layers { type: "linear" in_features: 32 out_features: 32 }
        layers { type: "relu" }
      }
    }
    stages {
      rank: 2
      rank_in: [ 1 ]
      graph { layers { type: "linear" in_features: 32 out_features: 4 } }
    }
  }
  loss: "cross_entropy"
  optimizer { kind: MOMENTUM lr: 0.1 momentum: 0.9 }
  batch_size: 16
  epochs: 3
  seed: 7
)pb";

v1::JobSpec parse_spec(const char* text) {
  v1::JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec));
  return spec;
}

std::string fresh_dir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(root != nullptr ? root : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// run_job on `size` rank threads over loopback; every rank's result (or the failures).
std::vector<JobResult> run_ranks(int size, const v1::JobSpec& spec, JobRunnerOptions options = {},
                                 std::string* failures = nullptr) {
  at::set_num_threads(1);
  auto worlds = comm::testing::loopback_worlds(size);
  comm::CommunicatorOptions comm_options;
  comm_options.timeout = std::chrono::seconds(30);
  std::vector<JobResult> results(size);
  std::string failed = comm::testing::failures(comm::testing::run_ranks(size, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, comm::create_communicator("flat", worlds[rank], comm_options));
    JobRunnerOptions mine = options;
    if (rank != 0) mine.metrics = nullptr;
    COHORT_ASSIGN_OR_RETURN(results[rank], run_job(spec, *comm, mine));
    return ok_status();
  }));
  if (failures != nullptr) {
    *failures = failed;
  } else {
    EXPECT_EQ(failed, "");
  }
  return results;
}

JobRunnerOptions quiet() {
  JobRunnerOptions options;
  options.out = nullptr;
  return options;
}

TEST(JobRunnerTest, TwoRankDataParallelLossFallsAndAccuracyIsGlobal) {
  std::vector<JobResult> results = run_ranks(2, parse_spec(kDataParallelSpec), quiet());
  ASSERT_EQ(results[0].epochs.size(), 3u);
  // 1024 samples over 2 ranks, 16 per rank per step.
  EXPECT_EQ(results[0].steps_per_epoch, 32);
  EXPECT_EQ(results[0].steps, 96);
  EXPECT_LT(results[0].epochs.back().train_loss, 0.6 * results[0].epochs.front().train_loss);
  EXPECT_GT(results[0].test_accuracy, 0.8);  // chance is 0.25
  // Evaluation is over every rank's test samples: both ranks report the same numbers.
  EXPECT_DOUBLE_EQ(results[0].test_accuracy, results[1].test_accuracy);
  EXPECT_DOUBLE_EQ(results[0].test_loss, results[1].test_loss);
}

TEST(JobRunnerTest, TwoRanksEqualOneRankWithTheDoubledBatch) {
  // One step: 2 ranks × 16 samples (gradients averaged) must equal 1 rank × 32 samples.
  v1::JobSpec spec = parse_spec(kDataParallelSpec);
  spec.mutable_dataset()->set_train_size(32);
  spec.mutable_optimizer()->set_kind(v1::SGD);
  spec.set_epochs(1);
  spec.set_batch_size(16);
  std::vector<JobResult> two = run_ranks(2, spec, quiet());
  spec.set_batch_size(32);
  std::vector<JobResult> one = run_ranks(1, spec, quiet());
  ASSERT_EQ(two[0].steps, 1);
  ASSERT_EQ(one[0].steps, 1);
  EXPECT_NEAR(two[0].epochs[0].train_loss, one[0].epochs[0].train_loss, 1e-5);
  EXPECT_NEAR(two[0].test_loss, one[0].test_loss, 1e-5);
  // The comparison can tell models apart: two steps of 16 on one rank end elsewhere.
  spec.set_batch_size(16);
  std::vector<JobResult> other = run_ranks(1, spec, quiet());
  EXPECT_GT(std::abs(other[0].test_loss - one[0].test_loss), 1e-4);
}

TEST(JobRunnerTest, ThreeRankModelParallelMlpTrains) {
  std::vector<JobResult> results = run_ranks(3, parse_spec(kModelParallelSpec), quiet());
  ASSERT_EQ(results[2].epochs.size(), 3u);
  EXPECT_EQ(results[2].steps_per_epoch, 64);  // every rank walks the whole set: 1024 / 16
  EXPECT_LT(results[2].epochs.back().train_loss, results[2].epochs.front().train_loss);
  EXPECT_GT(results[2].test_accuracy, 0.6);
  // Only rank 2 computes the loss, but every rank gets the global numbers.
  EXPECT_DOUBLE_EQ(results[0].test_accuracy, results[2].test_accuracy);
  EXPECT_DOUBLE_EQ(results[1].epochs.back().train_loss, results[2].epochs.back().train_loss);
}

// ChainerMN's NonConnectedGraph2 as stages over 2 ranks: on rank 0 the stage without rank_out
// (its output, to the loss) comes before a stage that sends; rank 1 sends first and ends with
// its own output. Both ranks train a classifier; the stage after rank 0's output must neither
// replace that output nor leave its send's backward waiting.
constexpr const char* kNonConnectedGraph2Spec = R"pb(
  name: "tiny-ncg2"
  dataset {
    kind: SYNTHETIC
    train_size: 1024
    test_size: 128
    input_shape: [ 1, 8, 8 ]
    num_classes: 4
  }
  model_parallel {
    stages {
      rank: 1
      rank_out: [ 0 ]
      graph {
        layers { type: "flatten" }
        layers { type: "linear" in_features: 64 out_features: 32 }
        layers { type: "relu" }
      }
    }
    stages {
      rank: 0
      rank_in: [ 1 ]
      graph { layers { type: "linear" in_features: 32 out_features: 4 } }
    }
    stages {
      rank: 0
      rank_out: [ 1 ]
      graph {
        layers { type: "flatten" }
        layers { type: "linear" in_features: 64 out_features: 32 }
        layers { type: "relu" }
      }
    }
    stages {
      rank: 1
      rank_in: [ 0 ]
      graph { layers { type: "linear" in_features: 32 out_features: 4 } }
    }
  }
  loss: "cross_entropy"
  optimizer { kind: MOMENTUM lr: 0.1 momentum: 0.9 }
  batch_size: 16
  epochs: 3
  seed: 7
)pb";

TEST(JobRunnerTest, NonConnectedGraph2StagesTrainOnBothRanks) {
  std::vector<JobResult> results = run_ranks(2, parse_spec(kNonConnectedGraph2Spec), quiet());
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(results[rank].epochs.size(), 3u) << "rank " << rank;
    EXPECT_LT(results[rank].epochs.back().train_loss, results[rank].epochs.front().train_loss) << "rank " << rank;
  }
  // Both ranks' classifiers are scored together (the global accuracy every rank reports): well
  // above the 0.25 of chance after 3 epochs.
  EXPECT_GT(results[0].test_accuracy, 0.45);
  EXPECT_DOUBLE_EQ(results[0].test_accuracy, results[1].test_accuracy);
}

TEST(JobRunnerTest, ParallelConvolutionGraphTrainsOnBroadcastBatches) {
  // parallel_conv2d needs the same input on every rank: the runner broadcasts rank 0's batches and
  // rank 0's replicated parameters, so both ranks keep identical models.
  v1::JobSpec spec = parse_spec(kDataParallelSpec);
  google::protobuf::TextFormat::ParseFromString(
      R"pb(
        layers { type: "parallel_conv2d" in_channels: 1 out_channels: 4 kernel_size: 3 padding: 1 }
        layers { type: "multi_node_batchnorm" num_features: 4 }
        layers { type: "relu" }
        layers { type: "max_pool2d" kernel_size: 2 }
        layers { type: "flatten" }
        layers { type: "linear" in_features: 64 out_features: 4 }
      )pb",
      spec.mutable_data_parallel()->mutable_graph());
  spec.set_epochs(2);
  std::vector<JobResult> results = run_ranks(2, spec, quiet());
  EXPECT_EQ(results[0].steps_per_epoch, 64);  // every rank walks all 1024 samples
  EXPECT_LT(results[0].epochs.back().train_loss, results[0].epochs.front().train_loss);
  EXPECT_GT(results[0].test_accuracy, 0.4);  // chance is 0.25
}

TEST(JobRunnerTest, AdamWithWarmupCosineAndOtherLossesTrain) {
  v1::JobSpec spec = parse_spec(kDataParallelSpec);
  spec.mutable_optimizer()->set_kind(v1::ADAM);
  spec.mutable_optimizer()->set_lr(0.01);
  spec.mutable_optimizer()->set_weight_decay(1e-4);
  spec.mutable_optimizer()->mutable_schedule()->set_kind(v1::COSINE);
  spec.mutable_optimizer()->mutable_schedule()->set_warmup_epochs(1);
  for (const char* loss : {"cross_entropy", "mse", "nll"}) {
    spec.set_loss(loss);
    std::vector<JobResult> results = run_ranks(1, spec, quiet());
    ASSERT_EQ(results[0].epochs.size(), 3u) << loss;
    EXPECT_LT(results[0].epochs.back().train_loss, results[0].epochs.front().train_loss) << loss;
  }
  spec.set_loss("hinge");
  std::string failures;
  run_ranks(1, spec, quiet(), &failures);
  EXPECT_NE(failures.find("loss \"hinge\" is not one of cross_entropy, nll, mse"), std::string::npos)
      << failures;
}

TEST(JobRunnerTest, ResumeContinuesFromTheSavedStepAndMatchesAnUninterruptedRun) {
  v1::JobSpec spec = parse_spec(kDataParallelSpec);
  spec.mutable_checkpoint()->set_dir(fresh_dir("resume"));
  spec.mutable_checkpoint()->set_interval_epochs(1);
  spec.set_epochs(2);
  std::vector<JobResult> first = run_ranks(2, spec, quiet());
  ASSERT_EQ(first[0].steps, 64);

  spec.set_epochs(3);
  JobRunnerOptions resume = quiet();
  resume.resume = true;
  std::vector<JobResult> resumed = run_ranks(2, spec, resume);
  ASSERT_TRUE(resumed[0].resumed_from.has_value());
  EXPECT_EQ(*resumed[0].resumed_from, 64);
  ASSERT_EQ(resumed[0].epochs.size(), 1u);  // only the third epoch ran
  EXPECT_EQ(resumed[0].epochs[0].epoch, 2);
  EXPECT_EQ(resumed[0].steps, 96);

  spec.mutable_checkpoint()->set_dir(fresh_dir("uninterrupted"));
  std::vector<JobResult> straight = run_ranks(2, spec, quiet());
  EXPECT_NEAR(resumed[0].test_loss, straight[0].test_loss, 1e-6);
  EXPECT_NEAR(resumed[0].epochs[0].train_loss, straight[0].epochs[2].train_loss, 1e-6);
}

TEST(JobRunnerTest, ResumeWithoutCheckpointStartsFromScratch) {
  v1::JobSpec spec = parse_spec(kDataParallelSpec);
  spec.mutable_checkpoint()->set_dir(fresh_dir("empty"));
  spec.mutable_checkpoint()->set_interval_epochs(1);
  spec.set_epochs(1);
  JobRunnerOptions options = quiet();
  options.resume = true;
  std::vector<JobResult> results = run_ranks(2, spec, options);
  EXPECT_FALSE(results[0].resumed_from.has_value());
  EXPECT_EQ(results[0].epochs.size(), 1u);
}

class RecordingSink : public MetricsSink {
 public:
  void report(const v1::Metrics& metrics, bool epoch_end) override {
    std::lock_guard<std::mutex> lock(mutex);
    reports.emplace_back(metrics, epoch_end);
  }
  std::mutex mutex;
  std::vector<std::pair<v1::Metrics, bool>> reports;
};

TEST(JobRunnerTest, ProgressLinesAndMetricsFromRankZero) {
  v1::JobSpec spec = parse_spec(kDataParallelSpec);
  spec.set_epochs(2);
  RecordingSink sink;
  JobRunnerOptions options;
  options.out = std::tmpfile();
  ASSERT_NE(options.out, nullptr);
  options.log_every_steps = 3;
  options.metrics = &sink;
  std::vector<JobResult> results = run_ranks(2, spec, options);

  std::rewind(options.out);
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), options.out)) > 0) text.append(buf, n);
  std::fclose(options.out);
  EXPECT_TRUE(std::regex_search(text, std::regex(R"(epoch 1/2 step 3/32 loss \d+\.\d{4} samples/s \d+)")))
      << text;
  EXPECT_TRUE(
      std::regex_search(text, std::regex(R"(epoch 2/2 loss \d+\.\d{4} test_loss \d+\.\d{4} test_acc)")))
      << text;
  // The last line is the one the CLI parses.
  std::smatch last;
  ASSERT_TRUE(std::regex_search(text, last, std::regex(R"(test accuracy (\d\.\d{4})\n$)"))) << text;
  EXPECT_NEAR(std::stod(last[1]), results[0].test_accuracy, 1e-4);

  int epoch_ends = 0;
  double comm_wait_s = 0;
  for (const auto& [metrics, epoch_end] : sink.reports) {
    // Time blocked in collectives (the gradient allreduces, the global means): cumulative, and a
    // share of each report interval.
    EXPECT_GE(metrics.comm_wait_s(), comm_wait_s);
    comm_wait_s = metrics.comm_wait_s();
    EXPECT_GE(metrics.comm_wait_ratio(), 0.0);
    EXPECT_LE(metrics.comm_wait_ratio(), 1.0);
    EXPECT_EQ(metrics.total_steps(), 64);
    EXPECT_EQ(metrics.total_epochs(), 2);
    // Data-parallel: each of the 2 ranks trains its own batch per step.
    EXPECT_EQ(metrics.samples_per_step(), 2 * spec.batch_size());
    EXPECT_EQ(metrics.rank(), 0);
    if (epoch_end) ++epoch_ends;
  }
  EXPECT_EQ(epoch_ends, 2);
  EXPECT_GT(comm_wait_s, 0.0) << "two ranks trained without ever waiting on a collective";
  ASSERT_FALSE(sink.reports.empty());
  EXPECT_EQ(sink.reports.back().first.step(), 64);
  EXPECT_DOUBLE_EQ(sink.reports.back().first.accuracy(), results[0].test_accuracy);
}

// A job that does not resume, started into a checkpoint.dir holding a newer run of its name
// (epochs 1 and 2: steps 32 and 64), fails on every rank with FAILED_PRECONDITION naming the
// directory, the iterations and how to go on, before it trains: no progress line (one per step
// here) and no metrics report. save() alone refused it only at epoch 1's checkpoint, 32 steps in.
// The old run's files stay, and it still resumes.
TEST(JobRunnerTest, FreshJobIntoADirectoryWithCheckpointsFailsBeforeItsFirstStep) {
  v1::JobSpec spec = parse_spec(kDataParallelSpec);
  const std::string dir = fresh_dir("taken");
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_interval_epochs(1);
  spec.set_epochs(2);
  ASSERT_EQ(run_ranks(2, spec, quiet())[0].steps, 64);

  spec.set_epochs(3);
  RecordingSink sink;
  JobRunnerOptions options;
  options.out = std::tmpfile();
  ASSERT_NE(options.out, nullptr);
  options.log_every_steps = 1;
  options.metrics = &sink;
  std::string failures;
  run_ranks(2, spec, options, &failures);
  std::rewind(options.out);
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), options.out)) > 0) text.append(buf, n);
  std::fclose(options.out);
  for (const char* rank : {"rank 0: ", "rank 1: "}) {
    EXPECT_NE(failures.find(std::string(rank) + "FAILED_PRECONDITION: checkpoint.dir " + dir +
                            ": checkpointer tiny: this run starts from scratch (it does not resume), but the "
                            "checkpoint directory " +
                            dir + " already holds checkpoints of tiny: iterations 32, 64 saved by 2 ranks."),
              std::string::npos)
        << failures;
  }
  EXPECT_NE(failures.find("To continue that run, resume it (COHORT_RESUME=1;"), std::string::npos)
      << failures;
  EXPECT_EQ(text, "") << "the refused job trained first";
  EXPECT_TRUE(sink.reports.empty()) << "the refused job reported " << sink.reports.size() << " time(s)";

  JobRunnerOptions resume = quiet();
  resume.resume = true;
  std::vector<JobResult> resumed = run_ranks(2, spec, resume);
  ASSERT_TRUE(resumed[0].resumed_from.has_value());
  EXPECT_EQ(*resumed[0].resumed_from, 64);
}

TEST(JobRunnerTest, ARestartedAttemptThatDoesNotResumeStartsOverInTheJobsOwnDirectory) {
  // Under cohortd a relative checkpoint.dir lies in the job's own directory (the ranks' working
  // directory), kept across attempts. A restart with restart_policy.from_checkpoint: false
  // (COHORT_ATTEMPT > 1, no COHORT_RESUME) starts from scratch: the earlier attempt's files are
  // its own job's, superseded, not another run's to refuse.
  v1::JobSpec spec = parse_spec(kDataParallelSpec);
  const fs::path job_dir = fresh_dir("own");
  const fs::path old_cwd = fs::current_path();
  fs::current_path(job_dir);
  spec.mutable_checkpoint()->set_dir("checkpoints");
  spec.mutable_checkpoint()->set_interval_epochs(1);
  spec.set_epochs(2);
  EXPECT_EQ(run_ranks(2, spec, quiet())[0].steps, 64);  // attempt 1: iterations 32 and 64

  setenv("COHORT_ATTEMPT", "2", 1);
  spec.set_epochs(1);
  std::string failures;
  std::vector<JobResult> restarted = run_ranks(2, spec, quiet(), &failures);
  unsetenv("COHORT_ATTEMPT");
  EXPECT_EQ(failures, "");
  EXPECT_EQ(restarted[0].steps, 32);

  // Only the restarted attempt's checkpoint is left: a resume loads it, not attempt 1's 64.
  JobRunnerOptions resume = quiet();
  resume.resume = true;
  std::vector<JobResult> resumed = run_ranks(2, spec, resume);
  fs::current_path(old_cwd);
  ASSERT_TRUE(resumed[0].resumed_from.has_value());
  EXPECT_EQ(*resumed[0].resumed_from, 32);
}

TEST(JobRunnerTest, ErrorsNameTheFaultOnEveryRank) {
  // A graph that does not fit its data: shape validation names the layer on every rank.
  v1::JobSpec spec = parse_spec(kDataParallelSpec);
  spec.mutable_data_parallel()->mutable_graph()->mutable_layers(1)->set_in_features(63);
  std::string failures;
  run_ranks(2, spec, quiet(), &failures);
  for (const char* rank : {"rank 0: ", "rank 1: "}) {
    EXPECT_NE(
        failures.find(std::string(rank) + "INVALID_ARGUMENT: invalid model: data_parallel.graph.layers[1] "
                                          "(linear 'linear1'): in_features is 63"),
        std::string::npos)
        << failures;
  }

  // Data only rank 0 reads: its error there, and the others stop too instead of waiting.
  spec = parse_spec(kDataParallelSpec);
  spec.mutable_data_parallel()->mutable_graph()->mutable_layers(1)->set_in_features(
      784);  // 28 x 28 IDX images
  spec.mutable_dataset()->set_kind(v1::IDX_DIR);
  spec.mutable_dataset()->set_path("/nonexistent/idx");
  run_ranks(2, spec, quiet(), &failures);
  EXPECT_NE(
      failures.find("rank 0: NOT_FOUND: dataset: neither /nonexistent/idx/train-images-idx3-ubyte.gz nor"),
      std::string::npos)
      << failures;
  EXPECT_NE(failures.find("rank 1: ABORTED: loading the dataset failed on another rank"), std::string::npos)
      << failures;
}

TEST(ScheduleTest, WarmupStepAndCosine) {
  v1::Optimizer optimizer;
  optimizer.set_lr(1.0);
  optimizer.mutable_schedule()->set_warmup_epochs(1);
  // 10 steps per epoch, 5 epochs.
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(optimizer, 5, 10, 0), 0.1);
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(optimizer, 5, 10, 9), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(optimizer, 5, 10, 30), 1.0);  // constant after warm-up
  optimizer.mutable_schedule()->set_kind(v1::STEP);
  optimizer.mutable_schedule()->set_step_epochs(2);
  optimizer.mutable_schedule()->set_gamma(0.5);
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(optimizer, 5, 10, 29), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(optimizer, 5, 10, 30), 0.5);
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(optimizer, 5, 10, 50), 0.25);
  optimizer.mutable_schedule()->set_kind(v1::COSINE);
  EXPECT_DOUBLE_EQ(scheduled_learning_rate(optimizer, 5, 10, 10), 1.0);
  EXPECT_NEAR(scheduled_learning_rate(optimizer, 5, 10, 30), 0.5, 1e-12);  // halfway through 4 epochs
  EXPECT_NEAR(scheduled_learning_rate(optimizer, 5, 10, 50), 0.0, 1e-12);
}

TEST(JobSpecFileTest, ReadsTextAndBinaryAndNamesBadFiles) {
  std::string dir = fresh_dir("specs");
  v1::JobSpec spec = parse_spec(kDataParallelSpec);
  {
    std::ofstream(dir + "/job.pbtxt") << kDataParallelSpec;
    std::ofstream binary(dir + "/job.pb", std::ios::binary);
    spec.SerializeToOstream(&binary);
    std::ofstream(dir + "/bad.pbtxt") << "name: \"x\"\nepochs: \"three\"\n";
  }
  StatusOr<v1::JobSpec> text = read_job_spec_file(dir + "/job.pbtxt");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_EQ(text->SerializeAsString(), spec.SerializeAsString());
  StatusOr<v1::JobSpec> binary = read_job_spec_file(dir + "/job.pb");
  ASSERT_TRUE(binary.ok()) << binary.status().to_string();
  EXPECT_EQ(binary->epochs(), 3);

  StatusOr<v1::JobSpec> bad = read_job_spec_file(dir + "/bad.pbtxt");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad.pbtxt: line 2"), std::string::npos) << bad.status().to_string();
  EXPECT_EQ(read_job_spec_file(dir + "/missing.pb").status().code(), StatusCode::kNotFound);

  std::ofstream(dir + "/job.yaml") << "name: y\ndataset: {kind: synthetic, train_size: 64, input_shape: [4], "
                                      "num_classes: 2}\nepochs: 2\n";
  StatusOr<v1::JobSpec> yaml = read_job_spec_file(dir + "/job.yaml");
  ASSERT_TRUE(yaml.ok()) << yaml.status().to_string();
  EXPECT_EQ(yaml->dataset().kind(), v1::SYNTHETIC);
  EXPECT_EQ(yaml->epochs(), 2);
  EXPECT_EQ(read_job_spec_file(dir + "/job.json").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::worker
