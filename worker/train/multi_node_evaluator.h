#pragma once

// Evaluation and observation across ranks (ChainerMN's create_multi_node_evaluator and
// ObservationAggregator). Plain C++ over the communicator: no libtorch in these headers.
//
//   auto evaluator = create_multi_node_evaluator([&]() -> StatusOr<Metrics> {
//     return Metrics{{"accuracy", {correct / double(n), n}}, {"loss", {loss_sum / n, n}}};
//   }, *comm);
//   std::map<std::string, double> global = evaluator->evaluate().value();   // same on every rank
//
// Weighting: each rank's value of a metric counts in proportion to its sample count, so the
// result is the metric over the union of the ranks' samples (for means such as accuracy and
// average loss), whatever the ranks' shard sizes.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"

namespace cohort::train {

// One metric of one rank: its value over `count` samples.
struct MetricValue {
  double value = 0;
  int64_t count = 0;
};
using Metrics = std::map<std::string, MetricValue>;

class MultiNodeEvaluator {
 public:
  using EvaluateFn = std::function<StatusOr<Metrics>()>;

  // `comm` must outlive the evaluator. Local: no communication.
  MultiNodeEvaluator(EvaluateFn evaluate_fn, comm::Communicator& comm);

  // Runs evaluate_fn on this rank, then averages each metric over all ranks weighted by sample
  // count: Σ value·count / Σ count (0 when no rank has a sample). One allreduce (SUM) of the
  // weighted sums, the counts and a hash of the metric names. Collective and blocking; every
  // rank must report the same metric names (else INVALID_ARGUMENT on every rank). An error of
  // evaluate_fn on one rank is returned there, and the others time out in the allreduce — so
  // evaluate_fn should fail on all ranks alike (or not at all).
  StatusOr<std::map<std::string, double>> evaluate();

 private:
  EvaluateFn evaluate_fn_;
  comm::Communicator& comm_;
};

// ChainerMN's name for the constructor.
std::unique_ptr<MultiNodeEvaluator> create_multi_node_evaluator(MultiNodeEvaluator::EvaluateFn evaluate_fn,
                                                                comm::Communicator& comm);

// Averages named scalar observations (loss, accuracy, …) over ranks every `interval` iterations:
// each rank's mean over the interval, then the unweighted mean over ranks (ChainerMN's
// ObservationAggregator). Single-threaded: one training thread calls observe()/end_iteration().
class ObservationAggregator {
 public:
  // `comm` must outlive the aggregator; interval >= 1 (smaller values are taken as 1).
  ObservationAggregator(comm::Communicator& comm, int64_t interval = 1);

  // Records `value` for `name` in the current interval. Local.
  void observe(const std::string& name, double value);

  // Ends an iteration. Every `interval`-th call is collective (one allreduce AVG, blocking) and
  // returns the averages of the interval's observations and starts a new interval; the other
  // calls are local and return nullopt. Every rank must observe the same names in an interval
  // (checked: INVALID_ARGUMENT on every rank otherwise).
  StatusOr<std::optional<std::map<std::string, double>>> end_iteration();

  int64_t iteration() const { return iteration_; }

 private:
  struct Sum {
    double sum = 0;
    int64_t count = 0;
  };
  comm::Communicator& comm_;
  int64_t interval_;
  int64_t iteration_ = 0;
  std::map<std::string, Sum> sums_;
};

}  // namespace cohort::train
