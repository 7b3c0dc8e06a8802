#include "worker/runner/job_run.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/ScalarType.h>
#include <fmt/format.h>
#include <torch/nn/module.h>

// JobRun's evaluation closing each epoch: accuracy and loss over all ranks' test samples, the
// epoch's line and its epoch-end report (worker/runner/job_run.h).

namespace cohort::worker::job_run {

Status JobRun::evaluate(int epoch, double epoch_loss_sum, int64_t epoch_loss_steps, int64_t epoch_samples,
                        double seconds) {
  if (sync_buffers_) COHORT_RETURN_IF_ERROR((*sync_buffers_)());
  model_.module->eval();
  double loss_sum = 0, correct = 0;
  int64_t n = 0;
  auto score = [&](const TensorDataset& host_batch) {
    const TensorDataset batch = on_device(host_batch);
    at::Tensor y = model_.forward(batch.inputs);
    if (!model_.computes_loss) return;
    y = y.detach();
    loss_sum += compute_loss(loss_, y, batch.targets).item<double>() * static_cast<double>(batch.size());
    if (y.dim() == 2 && !c10::isFloatingType(batch.targets.scalar_type())) {
      correct += y.argmax(1).eq(batch.targets).sum().item<double>();
    }
    n += batch.size();
  };
  if (sharded_) {
    at::NoGradGuard no_grad;
    for (int64_t begin = 0; begin < test_data_.size(); begin += kEvalBatch) {
      score(test_data_.slice(begin, std::min(test_data_.size(), begin + kEvalBatch)));
    }
  } else {
    test_batches_->set_position({0, 0});
    // The pipeline's transfers are autograd functions; the chain runs with grad mode on and the
    // outputs are detached (as the examples do).
    std::optional<at::NoGradGuard> no_grad;
    if (!model_.is_chain) no_grad.emplace();
    while (true) {
      COHORT_ASSIGN_OR_RETURN(std::optional<TensorDataset> batch, broadcast_test_->next());
      if (!batch.has_value()) break;
      score(*batch);
    }
  }
  double denom = n > 0 ? static_cast<double>(n) : 1.0;
  COHORT_ASSIGN_OR_RETURN(
      auto g,
      global({{"accuracy", {correct / denom, n}},
              {"test_loss", {loss_sum / denom, n}},
              {"train_loss", {epoch_loss_steps ? epoch_loss_sum / epoch_loss_steps : 0.0, epoch_loss_steps}},
              {"samples", {static_cast<double>(epoch_samples), 1}},
              {"seconds", {seconds, 1}}}));
  EpochResult epoch_result;
  epoch_result.epoch = epoch;
  epoch_result.train_loss = g["train_loss"];
  epoch_result.test_loss = g["test_loss"];
  epoch_result.test_accuracy = g["accuracy"];
  epoch_result.samples_per_s = g["samples"] * (sharded_ ? comm_.size() : 1) / std::max(1e-9, g["seconds"]);
  last_accuracy_ = epoch_result.test_accuracy;
  result_.test_accuracy = epoch_result.test_accuracy;
  result_.test_loss = epoch_result.test_loss;
  if (epoch_samples > 0) {  // not the evaluation of a run resumed after its last epoch
    result_.epochs.push_back(epoch_result);
    print(
        fmt::format("epoch {}/{} loss {:.4f} test_loss {:.4f} test_acc {:.4f} samples/s {:.0f} time {:.1f}s",
                    epoch + 1, spec_.epochs(), epoch_result.train_loss, epoch_result.test_loss,
                    epoch_result.test_accuracy, epoch_result.samples_per_s, seconds));
  }
  v1::Metrics metrics;
  metrics.set_step(step_);
  metrics.set_epoch(epoch);
  metrics.set_loss(epoch_result.train_loss);
  metrics.set_accuracy(epoch_result.test_accuracy);
  metrics.set_samples_per_s(epoch_result.samples_per_s);
  report(metrics, /*epoch_end=*/true);
  return ok_status();
}

}  // namespace cohort::worker::job_run
