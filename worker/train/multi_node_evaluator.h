#pragma once

// Evaluation and observation across ranks (ChainerMN's create_multi_node_evaluator and
// ObservationAggregator). Plain C++ over the communicator: no libtorch in these headers.
//
//   auto evaluator = create_multi_node_evaluator([&]() -> StatusOr<Metrics> {
//     return Metrics{{"accuracy", {correct / double(n), n}}, {"loss", {loss_sum / n, n}}};
//   }, *comm);
//   std::map<std::string, double> global = evaluator->evaluate().value();   // same on every rank
//
// Averaging (MultiNodeEvaluatorOptions::averaging):
//  - kSampleWeighted (the default): each rank's value of a metric counts in proportion to its
//    sample count, so the result is the metric over the union of the ranks' samples (for means
//    such as accuracy and average loss), whatever the ranks' shard sizes.
//  - kPlainMean: ChainerMN's documented behaviour, the unweighted mean of the ranks' values
//    (Σ value / size; counts are ignored). Equal to kSampleWeighted when shards are equal.
//
// The local evaluation is a callback or an object implementing Evaluator (ChainerMN wraps an
// evaluator object: create_multi_node_evaluator(actual_evaluator, comm)):
//
//   class TestEvaluator : public Evaluator {
//     StatusOr<Metrics> evaluate() override { ... }
//   };
//   auto evaluator = create_multi_node_evaluator(std::make_shared<TestEvaluator>(), *comm,
//                                                {MultiNodeEvaluatorOptions::Averaging::kPlainMean});

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

// A local evaluation as an object (Chainer's Evaluator: evaluate() returns the observations of
// this rank). Called on the thread that calls MultiNodeEvaluator::evaluate().
class Evaluator {
 public:
  virtual ~Evaluator() = default;
  // This rank's metrics; a MetricValue's count is its number of samples (used by
  // kSampleWeighted only).
  virtual StatusOr<Metrics> evaluate() = 0;
};

struct MultiNodeEvaluatorOptions {
  enum class Averaging {
    kSampleWeighted,  // Σ value·count / Σ count: the metric over all ranks' samples
    kPlainMean,       // Σ value / size: ChainerMN's mean over ranks
  };
  Averaging averaging = Averaging::kSampleWeighted;  // how ranks' values are combined
};

class MultiNodeEvaluator {
 public:
  using EvaluateFn = std::function<StatusOr<Metrics>()>;

  // `comm` must outlive the evaluator. Local: no communication.
  MultiNodeEvaluator(EvaluateFn evaluate_fn, comm::Communicator& comm, MultiNodeEvaluatorOptions options = {});
  // Wraps an evaluator object (shared: the caller may keep using it).
  MultiNodeEvaluator(std::shared_ptr<Evaluator> evaluator, comm::Communicator& comm,
                     MultiNodeEvaluatorOptions options = {});

  // Runs the local evaluation on this rank, then combines each metric over all ranks as
  // options.averaging says: kSampleWeighted gives Σ value·count / Σ count (0 when no rank has a
  // sample), kPlainMean Σ value / size. Two allreduces: a fixed-size one (MAX) of the number and a
  // hash of the metric names, then one (SUM) of the sums and the counts. Collective and blocking;
  // every rank must report the same metric names (else INVALID_ARGUMENT on every rank, before the
  // second allreduce, whatever the number of names). An error of the local evaluation on one rank is returned
  // there, and the others time out in the allreduce — so it should fail on all ranks alike (or
  // not at all).
  StatusOr<std::map<std::string, double>> evaluate();

  const MultiNodeEvaluatorOptions& options() const { return options_; }

 private:
  EvaluateFn evaluate_fn_;
  comm::Communicator& comm_;
  MultiNodeEvaluatorOptions options_;
};

// ChainerMN's name for the constructor, over a callback or an evaluator object.
std::unique_ptr<MultiNodeEvaluator> create_multi_node_evaluator(MultiNodeEvaluator::EvaluateFn evaluate_fn,
                                                                comm::Communicator& comm,
                                                                MultiNodeEvaluatorOptions options = {});
std::unique_ptr<MultiNodeEvaluator> create_multi_node_evaluator(std::shared_ptr<Evaluator> evaluator,
                                                                comm::Communicator& comm,
                                                                MultiNodeEvaluatorOptions options = {});

// Averages named scalar observations (loss, accuracy, …) over ranks every `interval` iterations:
// each rank's mean over the interval, then the unweighted mean over ranks (ChainerMN's
// ObservationAggregator). Single-threaded: one training thread calls observe()/end_iteration().
class ObservationAggregator {
 public:
  // `comm` must outlive the aggregator; interval >= 1 (smaller values are taken as 1).
  ObservationAggregator(comm::Communicator& comm, int64_t interval = 1);

  // Records `value` for `name` in the current interval. Local.
  void observe(const std::string& name, double value);

  // Ends an iteration. Every `interval`-th call is collective (blocking: a fixed-size allreduce
  // checking the names, then one SUM of the means, divided by size() locally) and
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
