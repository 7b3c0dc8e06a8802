#pragma once

// Job graph spec → libtorch modules (issue 6, cohort-worker): a cohort.v1.Graph becomes a
// torch::nn::Sequential with one named child per layer; a model-parallel stage's TorchScript body
// becomes a module wrapping the loaded script.
//
//   GraphBuildOptions options;
//   options.comm = comm.get();   // needed by parallel_conv2d and multi_node_batchnorm only
//   COHORT_ASSIGN_OR_RETURN(torch::nn::Sequential model, build_graph(spec.data_parallel().graph(), options));
//   at::Tensor logits = model->forward(images);
//
// Parameters left unset in a Layer take PyTorch's defaults (conv stride 1, padding 0, bias on;
// pooling stride = kernel_size; dropout p 0.5; batch norm eps 1e-5, momentum 0.1; ELU alpha 1;
// flatten dims 1..-1). A parameter the layer needs (linear's in/out_features, a conv's channels
// and kernel_size, ...) must be set. Initialization uses libtorch's defaults and the global RNG:
// seed it (at::manual_seed) before building for repeatable weights.
//
// Building is local (no communication), but the built parallel_conv2d / multi_node_batchnorm
// layers are collective in forward and backward over the communicator they were given, which must
// outlive the module.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"
#include "worker/comm/communicator.h"

namespace cohort::graph {

struct GraphBuildOptions {
  comm::Communicator* comm = nullptr;  // for parallel_conv2d / multi_node_batchnorm; not owned
};

// The layer types build_graph understands, in the order of job.proto's Layer comment.
const std::vector<std::string>& layer_types();

// The name a layer gets as a child module: its `name`, else "<type><index>" ("conv2d0").
std::string layer_name(const v1::Layer& layer, int index);

// One Sequential child per layer, named by layer_name, in order. INVALID_ARGUMENT names the layer
// ("layer 3 (conv2d \"conv2\"): kernel_size is not set") for an unknown type, a missing or
// out-of-range parameter, a duplicate name, or a parallel_conv2d / multi_node_batchnorm without a
// communicator; an empty graph is an error too.
StatusOr<torch::nn::Sequential> build_graph(const v1::Graph& graph, const GraphBuildOptions& options = {});

// A TorchScript module (torch.jit.save) as a torch::nn::Module: forward calls the script's forward
// with one tensor; the script's parameters are registered here (as "<path>_<name>", dots replaced)
// and share storage with the script, so optimizers and checkpointers see them.
class TorchScriptStageImpl : public torch::nn::Module {
 public:
  // Use load_torchscript_stage; this takes an already loaded module (type-erased to keep the JIT
  // headers out of this header).
  explicit TorchScriptStageImpl(std::shared_ptr<void> script);

  // Runs the script's forward(x); throws what the script throws.
  at::Tensor forward(const at::Tensor& x);

 private:
  std::shared_ptr<void> script_;  // a torch::jit::Module
};
TORCH_MODULE(TorchScriptStage);

// Loads `path` with torch::jit::load (blocking file I/O). NOT_FOUND when the file is missing,
// INVALID_ARGUMENT (with the loader's message) when it is not a TorchScript archive.
StatusOr<TorchScriptStage> load_torchscript_stage(const std::string& path);

// A stage body: the module holding its parameters and its one-tensor forward. (AnyModule cannot
// hold a Sequential, whose forward is a template.)
struct StageBody {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
};

// A stage's graph (build_graph) or TorchScript file (load_torchscript_stage). Errors as theirs; a
// stage with neither body is INVALID_ARGUMENT.
StatusOr<StageBody> build_stage_body(const v1::Stage& stage, const GraphBuildOptions& options = {});

}  // namespace cohort::graph
