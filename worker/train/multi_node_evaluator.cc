#include "worker/train/multi_node_evaluator.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace cohort::train {
namespace {

// Evaluation is rare and on the training thread: run collectives there.
const comm::CallOptions kBlocking{std::nullopt, true};

// A 32-bit FNV-1a hash of the names (exact in a double): with the number of names, the
// cross-check that precedes the data allreduce.
double names_hash(const std::vector<std::string>& names) {
  uint32_t h = 2166136261u;
  for (const auto& name : names) {
    for (unsigned char c : name) h = (h ^ c) * 16777619u;
    h = (h ^ 0xffu) * 16777619u;  // separator: {"ab"} and {"a","b"} differ
  }
  return static_cast<double>(h);
}

// Checks that every rank reports the same names, then sums `values` over all ranks in place
// (divided by size() when `average`).
//
// Two steps, so a mismatch is an error on every rank, never a hang or a false alarm:
//  - One allreduce MAX of a fixed-size header [n, hash, -n, -hash] gives every rank the largest
//    and smallest number of names and hash; they differ iff some rank differs (barring a hash
//    collision). Its size does not depend on the names, so ranks that disagree still complete it
//    (a data allreduce of different counts would not match up and would wait for the timeout).
//    MAX is exact, where a hash summed (or averaged: sum times fl(1/size)) would be rounded.
//  - Only then the data, with SUM; the average is taken here, not with ReduceOp::kAvg, so that
//    it is the same division on every communicator.
Status allreduce_checked(std::vector<double>& values, const std::vector<std::string>& names, bool average,
                         comm::Communicator& comm, const char* what) {
  const double count = static_cast<double>(names.size());
  const double hash = names_hash(names);
  double header[4] = {count, hash, -count, -hash};
  COHORT_RETURN_IF_ERROR(
      comm.allreduce(nullptr, header, 4, comm::DataType::kFloat64, comm::ReduceOp::kMax, kBlocking)->wait());
  if (header[0] != -header[2] || header[1] != -header[3]) {
    std::string joined;
    for (const auto& name : names) joined += (joined.empty() ? "" : ", ") + name;
    return invalid_argument_error(
        "{}: ranks of {} reported different metric names (this rank {}: {} names [{}]; ranks report "
        "between {} and {} names{}); every rank must report the same names in the same interval",
        what, comm.description(), comm.rank(), names.size(), joined, static_cast<int64_t>(-header[2]),
        static_cast<int64_t>(header[0]), header[0] == -header[2] ? ", the names differ" : "");
  }
  if (values.empty()) return ok_status();
  COHORT_RETURN_IF_ERROR(comm.allreduce(nullptr, values.data(), values.size(), comm::DataType::kFloat64,
                                        comm::ReduceOp::kSum, kBlocking)
                             ->wait());
  if (average) {
    for (double& v : values) v /= comm.size();
  }
  return ok_status();
}

}  // namespace

MultiNodeEvaluator::MultiNodeEvaluator(EvaluateFn evaluate_fn, comm::Communicator& comm,
                                       MultiNodeEvaluatorOptions options)
    : evaluate_fn_(std::move(evaluate_fn)), comm_(comm), options_(options) {}

MultiNodeEvaluator::MultiNodeEvaluator(std::shared_ptr<Evaluator> evaluator, comm::Communicator& comm,
                                       MultiNodeEvaluatorOptions options)
    : MultiNodeEvaluator(
          [evaluator = std::move(evaluator)]() -> StatusOr<Metrics> {
            if (evaluator == nullptr) {
              return invalid_argument_error("multi-node evaluator: the wrapped Evaluator is null");
            }
            return evaluator->evaluate();
          },
          comm, options) {}

StatusOr<std::map<std::string, double>> MultiNodeEvaluator::evaluate() {
  COHORT_ASSIGN_OR_RETURN(Metrics local, evaluate_fn_());
  const bool plain = options_.averaging == MultiNodeEvaluatorOptions::Averaging::kPlainMean;
  // Layout: [value·count (plain: value) for each metric, count for each metric] in name order.
  std::vector<std::string> names;
  std::vector<double> sums;
  for (const auto& [name, metric] : local) {
    names.push_back(name);
    sums.push_back(plain ? metric.value : metric.value * static_cast<double>(metric.count));
  }
  for (const auto& [name, metric] : local) sums.push_back(static_cast<double>(metric.count));
  COHORT_RETURN_IF_ERROR(allreduce_checked(sums, names, /*average=*/false, comm_, "multi-node evaluator"));
  std::map<std::string, double> out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (plain) {
      out[names[i]] = sums[i] / comm_.size();
      continue;
    }
    double count = sums[names.size() + i];
    out[names[i]] = count > 0 ? sums[i] / count : 0.0;
  }
  return out;
}

std::unique_ptr<MultiNodeEvaluator> create_multi_node_evaluator(MultiNodeEvaluator::EvaluateFn evaluate_fn,
                                                                comm::Communicator& comm,
                                                                MultiNodeEvaluatorOptions options) {
  return std::make_unique<MultiNodeEvaluator>(std::move(evaluate_fn), comm, options);
}

std::unique_ptr<MultiNodeEvaluator> create_multi_node_evaluator(std::shared_ptr<Evaluator> evaluator,
                                                                comm::Communicator& comm,
                                                                MultiNodeEvaluatorOptions options) {
  return std::make_unique<MultiNodeEvaluator>(std::move(evaluator), comm, options);
}

ObservationAggregator::ObservationAggregator(comm::Communicator& comm, int64_t interval)
    : comm_(comm), interval_(interval < 1 ? 1 : interval) {}

void ObservationAggregator::observe(const std::string& name, double value) {
  Sum& sum = sums_[name];
  sum.sum += value;
  ++sum.count;
}

StatusOr<std::optional<std::map<std::string, double>>> ObservationAggregator::end_iteration() {
  ++iteration_;
  if (iteration_ % interval_ != 0) return std::optional<std::map<std::string, double>>();
  std::vector<std::string> names;
  std::vector<double> means;
  for (const auto& [name, sum] : sums_) {
    names.push_back(name);
    means.push_back(sum.count > 0 ? sum.sum / static_cast<double>(sum.count) : 0.0);
  }
  sums_.clear();
  COHORT_RETURN_IF_ERROR(allreduce_checked(means, names, /*average=*/true, comm_, "observation aggregator"));
  std::map<std::string, double> out;
  for (size_t i = 0; i < names.size(); ++i) out[names[i]] = means[i];
  return std::optional<std::map<std::string, double>>(std::move(out));
}

}  // namespace cohort::train
