#include "worker/runner/job_run.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "worker/train/idx_dataset.h"
#include "worker/train/scatter_dataset.h"
#include "worker/train/synthetic_dataset.h"

// JobRun's data: the dataset rank 0 reads (or generates), its shards or broadcast batches, and
// batches on the device (worker/runner/job_run.h).

namespace cohort::worker::job_run {
namespace {

struct Splits {
  TensorDataset train;
  TensorDataset test;
};

// `dir`/`stem`.gz, else `dir`/`stem`.
StatusOr<std::string> idx_file(const std::string& dir, const std::string& stem) {
  std::error_code ec;
  for (const std::string& name : {stem + ".gz", stem}) {
    std::string path = (std::filesystem::path(dir) / name).string();
    if (std::filesystem::is_regular_file(path, ec)) return path;
  }
  return not_found_error("dataset: neither {0}/{1}.gz nor {0}/{1} exists", dir, stem);
}

// Images stay u8 (scaled by load_data once each rank has its part): a quarter of the bytes to hold
// at rank 0 and to scatter (Fashion-MNIST's train split: 47 MB instead of 188 MB).
StatusOr<TensorDataset> read_split(const std::string& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  COHORT_ASSIGN_OR_RETURN(std::string images, idx_file(dir, prefix + "-images-idx3-ubyte"));
  COHORT_ASSIGN_OR_RETURN(std::string labels, idx_file(dir, prefix + "-labels-idx1-ubyte"));
  return train::read_idx_dataset_u8(images, labels);
}

TensorDataset first(const TensorDataset& data, int64_t n) {
  return n > 0 && n < data.size() ? data.slice(0, n) : data;
}

StatusOr<Splits> load_dataset(const v1::Dataset& spec, uint64_t seed, const std::string& default_dir) {
  switch (spec.kind()) {
    case v1::SYNTHETIC: {
      if (spec.train_size() <= 0) return invalid_argument_error("dataset: SYNTHETIC needs train_size > 0");
      if (spec.num_classes() < 1) return invalid_argument_error("dataset: SYNTHETIC needs num_classes >= 1");
      if (spec.input_shape_size() == 0) return invalid_argument_error("dataset: SYNTHETIC needs input_shape");
      train::SyntheticDatasetOptions options;
      options.size = spec.train_size();
      options.sample_shape.assign(spec.input_shape().begin(), spec.input_shape().end());
      for (int64_t d : options.sample_shape) {
        if (d < 1) return invalid_argument_error("dataset: input_shape has a dimension {} < 1", d);
      }
      options.num_classes = spec.num_classes();
      options.seed = seed;
      Splits splits;
      splits.train = train::make_synthetic_dataset(options);
      // Held-out samples of the same classes: another seed, the same class means.
      options.size = spec.test_size() > 0 ? spec.test_size() : spec.train_size();
      options.seed = seed + 1;
      splits.test = train::make_synthetic_dataset(options);
      return splits;
    }
    case v1::FASHION_MNIST:
    case v1::IDX_DIR: {
      std::string dir = spec.path();
      if (dir.empty()) {
        if (spec.kind() == v1::IDX_DIR) return invalid_argument_error("dataset: IDX_DIR needs a path");
        dir = default_dir.empty() ? train::kFashionMnistDir : default_dir;
      }
      COHORT_ASSIGN_OR_RETURN(TensorDataset train_set, read_split(dir, true));
      COHORT_ASSIGN_OR_RETURN(TensorDataset test_set, read_split(dir, false));
      return Splits{first(train_set, spec.train_size()), first(test_set, spec.test_size())};
    }
    default:
      return invalid_argument_error("dataset: kind is not set (FASHION_MNIST, IDX_DIR or SYNTHETIC)");
  }
}

}  // namespace

Status JobRun::load_data() {
  // Rank 0 alone reads (or generates) the data; the others receive their part from it.
  Splits all;
  Status loaded;
  if (comm_.rank() == 0) {
    StatusOr<Splits> splits = load_dataset(spec_.dataset(), spec_.seed(), options_.fashion_mnist_dir);
    if (splits.ok()) {
      all = std::move(splits).value();
    } else {
      loaded = splits.status();
    }
  }
  COHORT_RETURN_IF_ERROR(agree(comm_, loaded, "loading the dataset"));
  if (sharded_) {
    // Equal shards: every rank takes the same number of steps (the optimizer's allreduces pair up).
    COHORT_ASSIGN_OR_RETURN(train_data_,
                            train::scatter_dataset(all.train, comm_, 0, /*shuffle=*/true, spec_.seed(),
                                                   /*force_equal_length=*/true));
    COHORT_ASSIGN_OR_RETURN(test_data_, train::scatter_dataset(all.test, comm_, 0, /*shuffle=*/false, 0,
                                                               /*force_equal_length=*/false));
  } else {
    train_data_ = all.train;
    test_data_ = all.test;
  }
  // idx images arrive as u8 (read_split): floats in [0, 1] from here on. Synthetic data is float.
  all = Splits{};
  train_data_ = train::scale_images(train_data_);
  test_data_ = train::scale_images(test_data_);
  COHORT_ASSIGN_OR_RETURN(double train_size,
                          comm_.allreduce_obj(static_cast<double>(train_data_.size()), comm::ReduceOp::kMax));
  if (train_size < 1) return invalid_argument_error("dataset: the training set is empty");
  steps_per_epoch_ = (static_cast<int64_t>(train_size) + spec_.batch_size() - 1) / spec_.batch_size();

  const uint64_t shuffle_seed = spec_.seed() + (sharded_ ? static_cast<uint64_t>(comm_.rank()) : 0);
  train_batches_ =
      std::make_unique<train::BatchIterator>(train_data_, spec_.batch_size(), /*shuffle=*/true, shuffle_seed);
  if (!sharded_) {
    train::BatchIterator* batches = train_batches_.get();
    broadcast_train_ = train::create_multi_node_iterator([batches] { return batches->next(); }, comm_, 0);
    test_batches_ = std::make_unique<train::BatchIterator>(test_data_, kEvalBatch, /*shuffle=*/false);
    train::BatchIterator* tests = test_batches_.get();
    broadcast_test_ = train::create_multi_node_iterator([tests] { return tests->next(); }, comm_, 0);
  }
  return ok_status();
}

StatusOr<std::optional<TensorDataset>> JobRun::next_train_batch() {
  if (sharded_) return train_batches_->next();
  return broadcast_train_->next();
}

TensorDataset JobRun::on_device(const TensorDataset& batch) const {
  if (options_.device.is_cpu()) return batch;
  return TensorDataset{batch.inputs.to(options_.device), batch.targets.to(options_.device)};
}

}  // namespace cohort::worker::job_run
