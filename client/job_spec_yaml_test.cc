#include "client/job_spec_yaml.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

namespace cohort::client {
namespace {

using google::protobuf::util::MessageDifferencer;

constexpr const char* kDataParallelYaml = R"(# a small CNN
name: fashion
nodes: 1
procs_per_node: 2
communicator: flat
dataset:
  kind: fashion_mnist
  path: /data/fashion
  train_size: 6000
data_parallel:
  graph:
    layers:
      - {type: conv2d, name: conv1, in_channels: 1, out_channels: 8, kernel_size: 3, padding: 1, bias: false}
      - {type: batchnorm2d, num_features: 8, eps: 1.0e-5}
      - {type: relu}
      - {type: max_pool2d, kernel_size: 2}
      - {type: flatten}
      - {type: dropout, p: 0.25}
      - {type: linear, in_features: 1568, out_features: 10}
loss: cross_entropy
optimizer:
  kind: momentum
  lr: 0.05
  momentum: 0.9
  schedule: {kind: step, step_epochs: 2, gamma: 0.5, warmup_epochs: 1}
batch_size: 64
epochs: 5
checkpoint: {dir: /tmp/ckpt, interval_epochs: 1}
restart_policy: {max_restarts: 2, from_checkpoint: yes}
seed: 18446744073709551615
)";

constexpr const char* kPipelineYaml = R"(
name: "123"
nodes: 1
procs_per_node: 3
dataset: {kind: synthetic, train_size: 64, input_shape: [784], num_classes: 10}
model_parallel:
  stages:
    - rank: 0
      rank_in: null
      rank_out: 1
      graph: {layers: [{type: linear, in_features: 784, out_features: 100}, {type: relu}]}
    - rank: 1
      rank_in: [0]
      rank_out: [2]
      graph: {layers: [{type: linear, in_features: 100, out_features: 100}]}
    - rank: 2
      rank_in: 1
      rank_out: []
      torchscript_file: /models/head.pt
loss: nll
optimizer: {kind: adam, lr: 0.001, beta1: 0.8}
batch_size: 32
epochs: 1
)";

StatusOr<cohort::v1::JobSpec> parse(const std::string& text) { return parse_job_spec_yaml(text, "job.yaml"); }

// The error text of a parse that must fail.
std::string parse_error(const std::string& text) {
  StatusOr<cohort::v1::JobSpec> spec = parse(text);
  EXPECT_FALSE(spec.ok()) << "parsed unexpectedly:\n" << text;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  return spec.status().message();
}

TEST(JobSpecYamlTest, ReadsEveryKindOfField) {
  StatusOr<cohort::v1::JobSpec> spec = parse(kDataParallelYaml);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name(), "fashion");
  EXPECT_EQ(spec->procs_per_node(), 2);
  EXPECT_EQ(spec->dataset().kind(), cohort::v1::FASHION_MNIST);
  EXPECT_EQ(spec->dataset().train_size(), 6000);
  ASSERT_TRUE(spec->has_data_parallel());
  const cohort::v1::Graph& graph = spec->data_parallel().graph();
  ASSERT_EQ(graph.layers_size(), 7);
  EXPECT_EQ(graph.layers(0).name(), "conv1");
  EXPECT_TRUE(graph.layers(0).has_bias());
  EXPECT_FALSE(graph.layers(0).bias());
  EXPECT_FALSE(graph.layers(0).has_stride());  // optional fields keep their presence
  EXPECT_DOUBLE_EQ(graph.layers(1).eps(), 1e-5);
  EXPECT_DOUBLE_EQ(graph.layers(5).p(), 0.25);
  EXPECT_EQ(spec->optimizer().kind(), cohort::v1::MOMENTUM);
  EXPECT_EQ(spec->optimizer().schedule().kind(), cohort::v1::STEP);
  EXPECT_TRUE(spec->restart_policy().from_checkpoint());
  EXPECT_EQ(spec->seed(), 18446744073709551615ULL);
}

TEST(JobSpecYamlTest, RankListsTakeAnIntAListOrNull) {
  StatusOr<cohort::v1::JobSpec> spec = parse(kPipelineYaml);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->name(), "123");  // quoted: a string, not a number
  const cohort::v1::ModelParallelModel& model = spec->model_parallel();
  ASSERT_EQ(model.stages_size(), 3);
  EXPECT_EQ(model.stages(0).rank_in_size(), 0);
  ASSERT_EQ(model.stages(0).rank_out_size(), 1);
  EXPECT_EQ(model.stages(0).rank_out(0), 1);
  ASSERT_EQ(model.stages(2).rank_in_size(), 1);
  EXPECT_EQ(model.stages(2).rank_in(0), 1);
  EXPECT_EQ(model.stages(2).rank_out_size(), 0);
  EXPECT_EQ(model.stages(2).torchscript_file(), "/models/head.pt");
  EXPECT_EQ(spec->dataset().input_shape_size(), 1);
}

TEST(JobSpecYamlTest, RoundTripsToAnEqualMessage) {
  for (const char* text : {kDataParallelYaml, kPipelineYaml}) {
    StatusOr<cohort::v1::JobSpec> spec = parse(text);
    ASSERT_TRUE(spec.ok()) << spec.status().to_string();
    const std::string rendered = job_spec_to_yaml(*spec);
    StatusOr<cohort::v1::JobSpec> again = parse_job_spec_yaml(rendered, "rendered.yaml");
    ASSERT_TRUE(again.ok()) << again.status().to_string() << "\n" << rendered;
    EXPECT_TRUE(MessageDifferencer::Equals(*spec, *again)) << rendered;
  }
}

TEST(JobSpecYamlTest, RoundTripsAwkwardValues) {
  cohort::v1::JobSpec spec;
  spec.set_name("null");  // must come back as the string, not as an unset field
  spec.set_communicator("true");
  spec.mutable_optimizer()->set_lr(0.1 + 0.2);  // not exactly representable in short decimal
  spec.mutable_optimizer()->set_weight_decay(1e-300);
  spec.mutable_data_parallel();  // an empty oneof member keeps the choice
  cohort::v1::Layer* layer = spec.mutable_model_parallel()->add_stages()->mutable_graph()->add_layers();
  layer->set_type("linear");
  layer->set_bias(false);
  layer->set_in_features(0);  // optional: present at zero
  const std::string rendered = job_spec_to_yaml(spec);
  StatusOr<cohort::v1::JobSpec> again = parse_job_spec_yaml(rendered, "rendered.yaml");
  ASSERT_TRUE(again.ok()) << again.status().to_string() << "\n" << rendered;
  EXPECT_TRUE(MessageDifferencer::Equals(spec, *again)) << rendered;
  EXPECT_TRUE(again->model_parallel().stages(0).graph().layers(0).has_in_features());
}

TEST(JobSpecYamlTest, RoundTripsTheFuzzersControlCharacterFind) {
  // job_spec_yaml_fuzzer's input (with its NUL): the name read from it held a control character,
  // which the rendered plain scalar lost. Strings with control characters are double-quoted now.
  const char input[] = "\nname: \350\247\246 \350\247\246\350\247\246\350\247\246a$paaa$p\350\247\246 "
                       "\350\247\246\350\247\246\350\247\246a$paaa$a4\0r";
  StatusOr<cohort::v1::JobSpec> spec = parse_job_spec_yaml(std::string(input, sizeof(input) - 1), "fuzz.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  const std::string rendered = job_spec_to_yaml(*spec);
  StatusOr<cohort::v1::JobSpec> again = parse_job_spec_yaml(rendered, "rendered.yaml");
  ASSERT_TRUE(again.ok()) << again.status().to_string() << "\n" << rendered;
  EXPECT_TRUE(MessageDifferencer::Equals(*spec, *again)) << spec->DebugString() << "---\n" << again->DebugString();
}

TEST(JobSpecYamlTest, SyntaxErrorNamesLineAndColumn) {
  const std::string message = parse_error("name: x\nnodes: [1, 2\nepochs: 1\n");
  EXPECT_NE(message.find("job.yaml:"), std::string::npos) << message;
  EXPECT_NE(message.find("YAML syntax error"), std::string::npos) << message;
}

TEST(JobSpecYamlTest, BadEnumListsTheChoices) {
  const std::string message = parse_error("name: x\noptimizer:\n  kind: sgdd\n");
  EXPECT_NE(message.find("job.yaml:3:9: optimizer.kind: 'sgdd' is not one of sgd, momentum, adam"),
            std::string::npos)
      << message;
  // The zero "unspecified" value is not a choice.
  EXPECT_NE(
      parse_error("dataset: {kind: dataset_kind_unspecified}").find("fashion_mnist, idx_dir, synthetic"),
      std::string::npos);
  EXPECT_NE(parse_error("optimizer: {schedule: {kind: linear}}").find("constant, step, cosine"),
            std::string::npos);
}

TEST(JobSpecYamlTest, UnknownKeyListsTheValidOnes) {
  const std::string message = parse_error("name: x\noptimiser: {kind: sgd}\n");
  EXPECT_NE(message.find("job.yaml:2:1: unknown key 'optimiser' (did you mean 'optimizer'?)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("procs_per_node"), std::string::npos) << message;
  const std::string nested = parse_error("data_parallel: {graph: {layers: [{type: relu, kernel: 3}]}}");
  EXPECT_NE(nested.find("data_parallel.graph.layers[0]: unknown key 'kernel'"), std::string::npos) << nested;
  EXPECT_NE(nested.find("kernel_size"), std::string::npos) << nested;
}

TEST(JobSpecYamlTest, WrongScalarTypeSaysWhatWasExpected) {
  EXPECT_NE(parse_error("nodes: two").find("nodes: 'two' is not a whole number"), std::string::npos);
  EXPECT_NE(parse_error("nodes: 1.5").find("nodes: '1.5' is not a whole number"), std::string::npos);
  EXPECT_NE(parse_error("nodes: [1]").find("nodes: a list is not a single value"), std::string::npos);
  EXPECT_NE(parse_error("nodes: 99999999999").find("out of range"), std::string::npos);
  EXPECT_NE(parse_error("seed: -1").find("seed: '-1' is negative"), std::string::npos);
  EXPECT_NE(parse_error("optimizer: {lr: fast}").find("optimizer.lr: 'fast' is not a number"),
            std::string::npos);
  EXPECT_NE(parse_error("restart_policy: {from_checkpoint: maybe}").find("is not true or false"),
            std::string::npos);
  EXPECT_NE(parse_error("optimizer: 0.1").find("optimizer: '0.1' is not a mapping"), std::string::npos);
  EXPECT_NE(parse_error("data_parallel: {graph: {layers: relu}}").find("is not a list"), std::string::npos);
  EXPECT_NE(parse_error("model_parallel: {stages: [{rank_in: [0, null]}]}").find("rank_in[1]: is null"),
            std::string::npos);
  EXPECT_NE(parse_error("- a\n- b\n").find("is not a mapping"), std::string::npos);
}

TEST(JobSpecYamlTest, StringThatIsNotUtf8IsAnError) {
  const std::string message = parse_error("name: ok\ncommunicator: f\xff\xff" "lat\n");
  EXPECT_NE(message.find("job.yaml:2:15: communicator: the value is not valid UTF-8"), std::string::npos)
      << message;
  EXPECT_NE(parse_error("name: \"\xc0\xaf\"").find("not valid UTF-8"), std::string::npos);      // overlong '/'
  EXPECT_NE(parse_error("name: \"\xed\xa0\x80\"").find("not valid UTF-8"), std::string::npos);  // a surrogate
  EXPECT_NE(parse_error("name: \"ab\xe2\x82\"").find("not valid UTF-8"), std::string::npos);     // cut short
  const auto spec = parse_job_spec_yaml("name: \"caf\xc3\xa9 \xf0\x9f\x9a\x80\"\n", "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->name(), "caf\xc3\xa9 \xf0\x9f\x9a\x80");
}

TEST(JobSpecYamlTest, BothModelsIsAnError) {
  const std::string message =
      parse_error("data_parallel: {graph: {layers: [{type: relu}]}}\nmodel_parallel: {stages: []}\n");
  EXPECT_NE(message.find("data_parallel and model_parallel are both set"), std::string::npos) << message;
  EXPECT_NE(parse_error("model_parallel: {stages: [{graph: {}, torchscript_file: a.pt}]}")
                .find("graph and torchscript_file are both set"),
            std::string::npos);
}

TEST(JobSpecYamlTest, DuplicateKeyIsAnError) {
  const std::string message = parse_error("nodes: 1\nepochs: 2\nnodes: 2\n");
  EXPECT_NE(message.find("job.yaml:3:1: nodes: is given twice (first on line 1)"), std::string::npos)
      << message;
}

TEST(JobSpecYamlTest, ReportsEveryProblem) {
  const std::string message = parse_error("nodes: x\nepochs: y\nfoo: 1\n");
  EXPECT_NE(message.find("nodes:"), std::string::npos) << message;
  EXPECT_NE(message.find("epochs:"), std::string::npos) << message;
  EXPECT_NE(message.find("'foo'"), std::string::npos) << message;
}

TEST(JobSpecYamlTest, EmptyFileIsAnError) {
  EXPECT_NE(parse_error("# nothing\n").find("holds no job spec"), std::string::npos);
}

TEST(JobSpecYamlTest, LoadsAFileAndNamesAMissingOne) {
  char dir_template[] = "/tmp/job_spec_yaml_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string path = std::string(dir_template) + "/job.yaml";
  {
    std::ofstream file(path);
    file << kPipelineYaml;
  }
  StatusOr<cohort::v1::JobSpec> spec = load_job_spec_file(path);
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_EQ(spec->model_parallel().stages_size(), 3);

  {
    std::ofstream file(path);
    file << "nodes: many\n";
  }
  spec = load_job_spec_file(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find(path + ":1:8: nodes:"), std::string::npos)
      << spec.status().message();

  StatusOr<cohort::v1::JobSpec> missing = load_job_spec_file(std::string(dir_template) + "/absent.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("absent.yaml"), std::string::npos);
  unlink(path.c_str());
  rmdir(dir_template);
}

TEST(JobSpecYamlTest, CommandJobsTakeAnArgvListAnEnvMappingAndAWorkingDir) {
  StatusOr<cohort::v1::JobSpec> spec = parse_job_spec_yaml(R"(name: ddp
nodes: 1
procs_per_node: 2
command: [/usr/bin/python3, train.py, --epochs, "2"]
env:
  OMP_NUM_THREADS: 1
  EMPTY: ""
working_dir: run
)",
                                                           "ddp.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  ASSERT_EQ(spec->command_size(), 4);
  EXPECT_EQ(spec->command(3), "2");
  EXPECT_EQ(spec->env().at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(spec->env().at("EMPTY"), "");
  EXPECT_EQ(spec->working_dir(), "run");
  StatusOr<cohort::v1::JobSpec> again = parse_job_spec_yaml(job_spec_to_yaml(*spec), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status().to_string() << "\n" << job_spec_to_yaml(*spec);
  EXPECT_TRUE(MessageDifferencer::Equals(*spec, *again)) << job_spec_to_yaml(*spec);
}

TEST(JobSpecYamlTest, EnvMustBeAMappingOfValues) {
  StatusOr<cohort::v1::JobSpec> spec = parse_job_spec_yaml("name: x\nenv: [A=1]\n", "x.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("x.yaml:2:6: env: a list is not a mapping"), std::string::npos)
      << spec.status().message();
  spec = parse_job_spec_yaml("name: x\nenv:\n  A: 1\n  A: 2\n", "x.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("env.A: is given twice"), std::string::npos) << spec.status().message();
  spec = parse_job_spec_yaml("name: x\nenv:\n  A:\n", "x.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("env.A: has no value"), std::string::npos) << spec.status().message();
}

std::vector<JobSpecOverride> overrides(const std::vector<std::string>& texts) {
  std::vector<JobSpecOverride> result;
  for (const std::string& text : texts) {
    StatusOr<JobSpecOverride> parsed = parse_job_spec_override(text);
    EXPECT_TRUE(parsed.ok()) << text << ": " << parsed.status().to_string();
    if (parsed.ok()) result.push_back(*parsed);
  }
  return result;
}

TEST(JobSpecOverrideTest, SetsScalarsEnumsMapsListEntriesAndNewMappings) {
  StatusOr<cohort::v1::JobSpec> spec = parse_job_spec_yaml(
      kDataParallelYaml, "job.yaml",
      overrides({"optimizer.lr=0.01", "epochs=3", "epochs=4", "dataset.kind=synthetic", "env.SEED=7", "name=123",
                 "data_parallel.graph.layers.6.out_features=12", "restart_policy.max_restarts=5",
                 "optimizer.schedule.gamma=0.25"}));
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 0.01);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);  // the rest of the mapping is kept
  EXPECT_EQ(spec->epochs(), 4);                        // a later --set wins
  EXPECT_EQ(spec->dataset().kind(), cohort::v1::SYNTHETIC);
  EXPECT_EQ(spec->dataset().path(), "/data/fashion");
  EXPECT_EQ(spec->env().at("SEED"), "7");
  EXPECT_EQ(spec->name(), "123");
  EXPECT_EQ(spec->data_parallel().graph().layers(6).out_features(), 12);
  EXPECT_EQ(spec->restart_policy().max_restarts(), 5);
  EXPECT_DOUBLE_EQ(spec->optimizer().schedule().gamma(), 0.25);
  // A mapping the file lacks is made; a repeated scalar takes a YAML list.
  StatusOr<cohort::v1::JobSpec> pipeline = parse_job_spec_yaml(
      kPipelineYaml, "p.yaml", overrides({"checkpoint.dir=/tmp/x", "model_parallel.stages.1.rank_out=[0, 2]"}));
  ASSERT_TRUE(pipeline.ok()) << pipeline.status().to_string();
  EXPECT_EQ(pipeline->checkpoint().dir(), "/tmp/x");
  ASSERT_EQ(pipeline->model_parallel().stages(1).rank_out_size(), 2);
  EXPECT_EQ(pipeline->model_parallel().stages(1).rank_out(1), 2);
}

TEST(JobSpecOverrideTest, BadPathsAndValuesAreNamed) {
  struct Case {
    std::string text;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {"optimizer.lrr=0.1", "--set optimizer.lrr=0.1: 'optimizer' has no field 'lrr' (did you mean 'lr'?)"},
           {"epoch=3", "a job spec has no field 'epoch' (did you mean 'epochs'?)"},
           {"optimizer.lr=fast", "optimizer.lr: 'fast' is not a number such as 0.05"},
           {"epochs=3.5", "epochs: '3.5' is not a whole number"},
           {"dataset.kind=imagenet", "dataset.kind: 'imagenet' is not one of"},
           {"optimizer=sgd", "optimizer is a mapping, not a value"},
           {"epochs.x=1", "epochs is a value and has no field 'x'"},
           {"data_parallel.graph.layers.out_features=1", "layers is a list of mappings"},
           {"env=1", "env is a map; name one key"},
           {"=1", "write PATH=VALUE"},
           {"optimizer..lr=1", "has an empty part"},
       }) {
    StatusOr<JobSpecOverride> parsed = parse_job_spec_override(c.text);
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(c.expected), std::string::npos) << parsed.status().message();
  }
  // An entry the file does not have is the file's problem, named with the override.
  StatusOr<cohort::v1::JobSpec> spec = parse_job_spec_yaml(
      kDataParallelYaml, "job.yaml", overrides({"data_parallel.graph.layers.9.out_features=1"}));
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("job.yaml: --set data_parallel.graph.layers.9.out_features=1: the file's "
                                         "data_parallel.graph.layers has 7 entries"),
            std::string::npos)
      << spec.status().message();
}

}  // namespace
}  // namespace cohort::client
