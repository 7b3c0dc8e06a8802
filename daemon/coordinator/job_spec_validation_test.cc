#include "daemon/coordinator/job_spec_validation.h"

#include <string>

#include <gtest/gtest.h>

#include "daemon/coordinator/test_specs.h"

namespace cohort::coordinator {
namespace {

using testing::valid_spec;

// Expects an INVALID_ARGUMENT whose message contains every fragment.
void expect_invalid(const cohort::v1::JobSpec& spec, std::initializer_list<std::string> fragments) {
  Status status = validate_job_spec(spec);
  ASSERT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
  for (const std::string& fragment : fragments) {
    EXPECT_NE(status.message().find(fragment), std::string::npos)
        << "missing '" << fragment << "' in: " << status.message();
  }
}

// A two-stage pipeline over 2 ranks: rank 0 reads the data and sends to rank 1.
cohort::v1::JobSpec pipeline_spec() {
  cohort::v1::JobSpec spec = valid_spec("pipe", 1, 2);
  cohort::v1::ModelParallelModel* model = spec.mutable_model_parallel();
  cohort::v1::Stage* first = model->add_stages();
  first->mutable_graph()->add_layers()->set_type("linear");
  first->set_rank(0);
  first->add_rank_out(1);
  cohort::v1::Stage* second = model->add_stages();
  second->set_torchscript_file("head.pt");
  second->set_rank(1);
  second->add_rank_in(0);
  return spec;
}

TEST(JobSpecValidationTest, AValidSpecPasses) {
  EXPECT_TRUE(validate_job_spec(valid_spec()).ok());
  EXPECT_TRUE(validate_job_spec(pipeline_spec()).ok());
  for (const char* kind : kCommunicatorKinds) {
    cohort::v1::JobSpec spec = valid_spec();
    spec.set_communicator(kind);
    spec.set_gpus_per_proc(1);
    EXPECT_TRUE(validate_job_spec(spec).ok()) << kind;
  }
}

TEST(JobSpecValidationTest, CountsMustBePositiveAndTheMessageNamesFieldAndValue) {
  cohort::v1::JobSpec spec = valid_spec();
  spec.set_nodes(0);
  expect_invalid(spec, {"nodes is 0; it must be at least 1"});
  spec = valid_spec();
  spec.set_procs_per_node(-2);
  expect_invalid(spec, {"procs_per_node is -2"});
  spec = valid_spec();
  spec.set_batch_size(0);
  expect_invalid(spec, {"batch_size is 0"});
  spec = valid_spec();
  spec.set_epochs(0);
  expect_invalid(spec, {"epochs is 0"});
}

TEST(JobSpecValidationTest, EveryProblemIsReportedNotOnlyTheFirst) {
  cohort::v1::JobSpec spec = valid_spec();
  spec.set_nodes(0);
  spec.set_epochs(0);
  spec.set_communicator("ring");
  expect_invalid(spec, {"nodes is 0", "epochs is 0", "communicator 'ring' is not a communicator kind",
                        "naive, flat, hierarchical, two_dimensional, single_node, pure_nccl"});
}

TEST(JobSpecValidationTest, PureNcclNeedsGpus) {
  cohort::v1::JobSpec spec = valid_spec();
  spec.set_communicator("pure_nccl");
  expect_invalid(spec, {"communicator 'pure_nccl' needs GPUs, but gpus_per_proc is 0"});
}

TEST(JobSpecValidationTest, NamesMustBeUsableInIdsAndUrls) {
  cohort::v1::JobSpec spec = valid_spec("my job");
  expect_invalid(spec, {"name 'my job' has ' ' at position 2"});
  spec = valid_spec("");
  expect_invalid(spec, {"name is empty"});
  spec = valid_spec(std::string(65, 'x'));
  expect_invalid(spec, {"is 65 characters; at most 64"});
}

TEST(JobSpecValidationTest, DatasetAndModelAndOptimizerMustBeGiven) {
  cohort::v1::JobSpec spec = valid_spec();
  spec.clear_dataset();
  spec.clear_model();
  spec.clear_optimizer();
  expect_invalid(spec, {"dataset.kind is not set", "model is not set", "optimizer.kind is not set",
                        "optimizer.lr is 0"});

  spec = valid_spec();
  spec.mutable_dataset()->set_kind(cohort::v1::IDX_DIR);
  expect_invalid(spec, {"dataset.path is empty"});

  spec = valid_spec();
  spec.mutable_dataset()->set_input_shape(0, 0);
  expect_invalid(spec, {"dataset.input_shape[0] is 0"});

  spec = valid_spec();
  spec.mutable_data_parallel()->mutable_graph()->clear_layers();
  expect_invalid(spec, {"data_parallel.graph has no layers"});
}

TEST(JobSpecValidationTest, StageRanksMustLieInsideTheWorld) {
  cohort::v1::JobSpec spec = pipeline_spec();
  spec.mutable_model_parallel()->mutable_stages(1)->set_rank(2);
  expect_invalid(spec, {"model_parallel.stages[1].rank is 2; the world has ranks 0 .. 1"});
}

TEST(JobSpecValidationTest, StageWiringMustBeDeclaredAtBothEnds) {
  // Rank 1 receives from rank 0, but rank 0 sends nowhere: rank 1 would wait forever.
  cohort::v1::JobSpec spec = pipeline_spec();
  spec.mutable_model_parallel()->mutable_stages(0)->clear_rank_out();
  expect_invalid(spec, {"stages[1].rank_in[0] is 0, but no stage on rank 0 sends to rank 1"});

  spec = pipeline_spec();
  spec.mutable_model_parallel()->mutable_stages(1)->clear_rank_in();
  expect_invalid(spec, {"stages[0].rank_out[0] is 1, but no stage on rank 1 receives from rank 0"});

  spec = pipeline_spec();
  spec.mutable_model_parallel()->mutable_stages(0)->clear_body();
  expect_invalid(spec, {"stages[0] has neither graph nor torchscript_file"});
}

// ChainerMN's NonConnectedGraph2 as stages: rank 0's stage without rank_out (the output) comes
// before a stage that sends; rank 1 sends first and receives last.
cohort::v1::JobSpec non_connected_graph2_spec() {
  cohort::v1::JobSpec spec = valid_spec("ncg2", 1, 2);
  cohort::v1::ModelParallelModel* model = spec.mutable_model_parallel();
  auto add = [&](int rank, std::initializer_list<int> rank_in, std::initializer_list<int> rank_out) {
    cohort::v1::Stage* stage = model->add_stages();
    stage->mutable_graph()->add_layers()->set_type("linear");
    stage->set_rank(rank);
    for (int r : rank_in) stage->add_rank_in(r);
    for (int r : rank_out) stage->add_rank_out(r);
  };
  add(1, {}, {0});  // stages[0]: sub_c
  add(0, {1}, {});  // stages[1]: sub_a, rank 0's output
  add(0, {}, {1});  // stages[2]: sub_b, after the output
  add(1, {0}, {});  // stages[3]: sub_d, rank 1's output
  return spec;
}

TEST(JobSpecValidationTest, AnOutputStageBeforeASendingStagePasses) {
  Status status = validate_job_spec(non_connected_graph2_spec());
  EXPECT_TRUE(status.ok()) << status.to_string();
}

TEST(JobSpecValidationTest, ARankGivesOneOutputAndNoStageTalksToItsOwnRank) {
  // A second stage on rank 0 without rank_out: the chain would drop one of the outputs.
  cohort::v1::JobSpec spec = non_connected_graph2_spec();
  spec.mutable_model_parallel()->mutable_stages(2)->clear_rank_out();
  spec.mutable_model_parallel()->mutable_stages(3)->clear_rank_in();
  expect_invalid(spec, {"model_parallel.stages[1] and stages[2] both run on rank 0 without rank_out"});

  spec = non_connected_graph2_spec();
  spec.mutable_model_parallel()->mutable_stages(1)->set_rank_in(0, 0);
  expect_invalid(spec, {"model_parallel.stages[1].rank_in[0] is 0, the stage's own rank"});

  spec = non_connected_graph2_spec();
  spec.mutable_model_parallel()->mutable_stages(0)->set_rank_out(0, 1);
  expect_invalid(spec, {"model_parallel.stages[0].rank_out[0] is 1, the stage's own rank"});
}

TEST(JobSpecValidationTest, CheckpointingNeedsAnInterval) {
  cohort::v1::JobSpec spec = valid_spec();
  spec.mutable_checkpoint()->set_dir("ckpt");
  expect_invalid(spec, {"checkpoint.interval_epochs is 0"});
  spec.mutable_checkpoint()->set_interval_epochs(1);
  EXPECT_TRUE(validate_job_spec(spec).ok());
}

TEST(JobSpecValidationTest, ResumingFromACheckpointNeedsACheckpointDir) {
  cohort::v1::JobSpec spec = valid_spec();
  spec.mutable_restart_policy()->set_max_restarts(1);
  spec.mutable_restart_policy()->set_from_checkpoint(true);
  expect_invalid(spec, {"restart_policy.from_checkpoint is true but checkpoint.dir is empty"});
  spec.mutable_checkpoint()->set_dir("ckpt");
  spec.mutable_checkpoint()->set_interval_epochs(1);
  EXPECT_TRUE(validate_job_spec(spec).ok());
}

TEST(JobSpecValidationTest, SpecPathsMustLieUnderTheAllowedRoots) {
  cohort::v1::JobSpec spec = valid_spec();
  spec.mutable_checkpoint()->set_dir("/etc/cron.d");
  spec.mutable_checkpoint()->set_interval_epochs(1);
  expect_invalid(spec, {"checkpoint.dir '/etc/cron.d' lies outside the allowed roots", "/usr/share/datasets",
                        "allowed_path_roots"});
  spec.mutable_checkpoint()->set_dir("ckpt/../../../etc");
  expect_invalid(spec, {"checkpoint.dir 'ckpt/../../../etc' lies outside"});
  spec.mutable_checkpoint()->set_dir("runs/ckpt");  // relative: inside the job's directory
  EXPECT_TRUE(validate_job_spec(spec).ok());

  spec = valid_spec();
  spec.mutable_dataset()->set_kind(cohort::v1::IDX_DIR);
  spec.mutable_dataset()->set_path("/usr/share/datasets/../../../home/someone");
  expect_invalid(spec, {"dataset.path '/usr/share/datasets/../../../home/someone' lies outside"});
  spec.mutable_dataset()->set_path("/usr/share/datasets/kmnist");
  EXPECT_TRUE(validate_job_spec(spec).ok());
  // An operator's root admits more.
  spec.mutable_dataset()->set_path("/srv/data/kmnist");
  expect_invalid(spec, {"dataset.path '/srv/data/kmnist' lies outside"});
  JobSpecValidationOptions options;
  options.allowed_path_roots = {"/srv/data"};
  EXPECT_TRUE(validate_job_spec(spec, options).ok());

  spec = pipeline_spec();
  spec.mutable_model_parallel()->mutable_stages(1)->set_torchscript_file("/root/stage.pt");
  expect_invalid(spec, {"model_parallel.stages[1].torchscript_file '/root/stage.pt' lies outside"});
}

cohort::v1::JobSpec command_spec() {
  cohort::v1::JobSpec spec;
  spec.set_name("ddp");
  spec.set_nodes(1);
  spec.set_procs_per_node(2);
  spec.add_command("/usr/bin/python3");
  spec.add_command("train.py");
  (*spec.mutable_env())["OMP_NUM_THREADS"] = "1";
  spec.set_working_dir("run");
  return spec;
}

TEST(JobSpecValidationTest, ACommandJobNeedsNoModel) {
  Status status = validate_job_spec(command_spec());
  EXPECT_TRUE(status.ok()) << status.to_string();
  cohort::v1::JobSpec spec = command_spec();
  spec.mutable_restart_policy()->set_from_checkpoint(true);  // no checkpoint.dir: the program's own
  spec.mutable_restart_policy()->set_max_restarts(1);
  EXPECT_TRUE(validate_job_spec(spec).ok());
}

TEST(JobSpecValidationTest, ACommandJobWithModelFieldsIsRefusedNamingThem) {
  cohort::v1::JobSpec spec = valid_spec();
  spec.add_command("/usr/bin/python3");
  expect_invalid(spec, {"command is set, and so is data_parallel, dataset, loss, optimizer, batch_size, epochs",
                        "never both"});
}

TEST(JobSpecValidationTest, CommandProblemsAreNamed) {
  cohort::v1::JobSpec spec = command_spec();
  spec.set_command(0, "");
  expect_invalid(spec, {"command[0] is empty"});
  spec = command_spec();
  spec.clear_command();
  spec.add_command("python3 train.py --epochs 2");
  expect_invalid(spec, {"a whole command line in one string", "command: [python3, train.py, --epochs, 2]"});
  spec = command_spec();
  for (int i = 0; i < kMaxCommandArguments; ++i) spec.add_command("x");
  expect_invalid(spec, {"kMaxCommandArguments"});
}

TEST(JobSpecValidationTest, EnvNamesMustBeValidAndNotCohorts) {
  cohort::v1::JobSpec spec = command_spec();
  (*spec.mutable_env())["RANK"] = "3";
  (*spec.mutable_env())["COHORT_JOB_SECRET"] = "x";
  (*spec.mutable_env())["1BAD"] = "x";
  expect_invalid(spec, {"env.RANK is set by cohort", "env.COHORT_JOB_SECRET is set by cohort",
                        "env.\"1BAD\" is not a variable name"});
}

TEST(JobSpecValidationTest, WorkingDirIsConfinedLikeOtherPaths) {
  cohort::v1::JobSpec spec = command_spec();
  spec.set_working_dir("/etc");
  expect_invalid(spec, {"working_dir", "/etc", "allowed_path_roots"});
  spec.set_working_dir("../other-job");
  expect_invalid(spec, {"working_dir"});
}

TEST(JobSpecValidationTest, TheAllowListNamesItself) {
  JobSpecValidationOptions options;
  options.allowed_commands = {"/usr/bin/python3", "/opt/cohort/bin/train_mnist_dp"};
  EXPECT_TRUE(validate_job_spec(command_spec(), options).ok());
  cohort::v1::JobSpec spec = command_spec();
  spec.set_command(0, "/bin/bash");
  Status status = validate_job_spec(spec, options);
  ASSERT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("command[0] \"/bin/bash\" is not an allowed command"), std::string::npos);
  EXPECT_NE(status.message().find("/usr/bin/python3, /opt/cohort/bin/train_mnist_dp"), std::string::npos)
      << status.message();
  spec.set_command(0, "python3");
  status = validate_job_spec(spec, options);
  EXPECT_NE(status.message().find("give the absolute path"), std::string::npos) << status.message();
  // Graph jobs run the admin's own cohort-worker: the list does not apply to them...
  EXPECT_TRUE(validate_job_spec(valid_spec(), options).ok());
  // ...but no job may then set variables that make a program load other code.
  cohort::v1::JobSpec preload = valid_spec();
  (*preload.mutable_env())["LD_PRELOAD"] = "/home/u/x.so";
  (*preload.mutable_env())["PYTHONSTARTUP"] = "/home/u/x.py";
  (*preload.mutable_env())["OMP_NUM_THREADS"] = "1";
  status = validate_job_spec(preload, options);
  ASSERT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("env sets LD_PRELOAD, PYTHONSTARTUP, which would make an allowed program load"),
            std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("allowed_commands"), std::string::npos);
  EXPECT_TRUE(validate_job_spec(preload).ok()) << "without a list, a job's env is its own business";
  EXPECT_FALSE(validate_allowed_commands({"python3"}).ok());
  EXPECT_TRUE(validate_allowed_commands({"/usr/bin/python3"}).ok());
}

}  // namespace
}  // namespace cohort::coordinator
