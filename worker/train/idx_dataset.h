#pragma once

// Readers for the idx format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/),
// plain or gzip-compressed (zlib reads both transparently).
//
//   auto train = read_idx_dataset(fashion_mnist_path("train-images-idx3-ubyte.gz"),
//                                 fashion_mnist_path("train-labels-idx1-ubyte.gz"));
//   if (!train.ok()) { /* train.status() names the file and what is wrong */ }
//   // train->inputs: 60000×1×28×28 float in [0, 1]; train->targets: 60000 int64
//
// Format: a 4-byte magic (0, 0, element type, number of dimensions), one big-endian uint32 per
// dimension, then the elements in row-major order, big-endian.

#include <string>

#include <ATen/ATen.h>

#include "worker/base/status.h"
#include "worker/train/tensor_dataset.h"

namespace cohort::train {

// Debian's dataset-fashion-mnist install directory.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// kFashionMnistDir + "/" + file ("train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", ...).
std::string fashion_mnist_path(const std::string& file);

// One idx file as a tensor of its own element type (u8 → kByte, i8 → kChar, i16 → kShort,
// i32 → kInt, f32 → kFloat, f64 → kDouble) and its dimensions. Blocking file I/O. Errors
// (NOT_FOUND, DATA_LOSS for truncated or malformed data, INVALID_ARGUMENT for an unknown
// magic) name the file.
StatusOr<at::Tensor> read_idx_file(const std::string& path);

// An image file (3 dims N×H×W, u8) and its label file (1 dim N, u8): inputs N×1×H×W float
// scaled to [0, 1], targets N int64. Errors when the shapes, types or counts disagree.
StatusOr<TensorDataset> read_idx_dataset(const std::string& images_path, const std::string& labels_path);

// As read_idx_dataset, but the inputs stay u8 (N×1×H×W, 0..255): a quarter of the float bytes
// (Fashion-MNIST's train split: 47 MB instead of 188 MB). A rank that keeps only part of a split
// selects its samples first and scales just those (scale_images), so the whole split never
// exists as floats.
StatusOr<TensorDataset> read_idx_dataset_u8(const std::string& images_path, const std::string& labels_path);

// u8 inputs as float scaled to [0, 1] (exactly read_idx_dataset's values); targets are shared,
// not copied. Inputs of another type are returned as they are.
TensorDataset scale_images(const TensorDataset& data);

// The Fashion-MNIST train (60 000) or test (10 000) split from kFashionMnistDir.
StatusOr<TensorDataset> read_fashion_mnist(bool train);
// The same with u8 inputs (read_idx_dataset_u8).
StatusOr<TensorDataset> read_fashion_mnist_u8(bool train);

}  // namespace cohort::train
