#include "worker/train/idx_dataset.h"

#include <zlib.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace cohort::train {
namespace {

// Far above any real idx file (MNIST's largest is 47 MB) and below what a corrupt header could
// claim: a bad dimension fails with a message instead of a huge allocation.
constexpr uint64_t kMaxIdxElements = uint64_t{1} << 32;
constexpr int kMaxIdxDims = 8;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads exactly `size` bytes; DATA_LOSS naming `what` when the file ends first.
Status read_exact(gzFile file, const std::string& path, void* out, size_t size, const char* what) {
  auto* dst = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < size) {
    // gzread takes an unsigned count: read in chunks well below its limit.
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - done, size_t{1} << 30));
    int got = gzread(file, dst + done, chunk);
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(file, &err);
      return data_loss_error("idx file {}: reading the {} failed: {}", path, what, msg);
    }
    if (got == 0) {
      return data_loss_error("idx file {} is truncated: the {} needs {} bytes, the file ends after {}", path,
                             what, size, done);
    }
    done += static_cast<size_t>(got);
  }
  return ok_status();
}

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// Element type code of the idx magic's third byte.
StatusOr<at::ScalarType> idx_scalar_type(uint8_t code, const std::string& path) {
  switch (code) {
    case 0x08:
      return at::kByte;
    case 0x09:
      return at::kChar;
    case 0x0B:
      return at::kShort;
    case 0x0C:
      return at::kInt;
    case 0x0D:
      return at::kFloat;
    case 0x0E:
      return at::kDouble;
    default:
      return invalid_argument_error(
          "idx file {}: unknown element type 0x{:02x} in the magic (expected 0x08 u8, 0x09 i8, 0x0b i16, "
          "0x0c i32, 0x0d f32 or 0x0e f64); is this an idx file?",
          path, code);
  }
}

// idx stores multi-byte elements big-endian: swap them in place on little-endian hosts.
void to_host_order(uint8_t* data, size_t count, size_t width) {
  uint16_t probe = 1;
  uint8_t first = 0;
  std::memcpy(&first, &probe, 1);
  if (width == 1 || first == 0) return;  // big-endian host: already in order
  for (size_t i = 0; i < count; ++i) {
    uint8_t* e = data + i * width;
    for (size_t a = 0, b = width - 1; a < b; ++a, --b) std::swap(e[a], e[b]);
  }
}

}  // namespace

std::string fashion_mnist_path(const std::string& file) { return std::string(kFashionMnistDir) + "/" + file; }

StatusOr<at::Tensor> read_idx_file(const std::string& path) {
  errno = 0;
  GzFile file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    int err = errno;
    if (err == ENOENT) {
      return not_found_error("idx file {} does not exist (Fashion-MNIST: apt install dataset-fashion-mnist)",
                             path);
    }
    return errno_status(fmt::format("gzopen({})", path), err);
  }
  uint8_t magic[4];
  COHORT_RETURN_IF_ERROR(read_exact(file.get(), path, magic, sizeof(magic), "4-byte magic"));
  if (magic[0] != 0 || magic[1] != 0) {
    return invalid_argument_error(
        "idx file {}: the magic must start with two zero bytes, got {:02x} {:02x}; is this an idx file?",
        path, magic[0], magic[1]);
  }
  COHORT_ASSIGN_OR_RETURN(at::ScalarType type, idx_scalar_type(magic[2], path));
  int dims = magic[3];
  if (dims == 0 || dims > kMaxIdxDims) {
    return invalid_argument_error("idx file {}: {} dimensions in the magic, expected 1 to {}", path, dims,
                                  kMaxIdxDims);
  }
  std::vector<uint8_t> header(4 * static_cast<size_t>(dims));
  COHORT_RETURN_IF_ERROR(read_exact(file.get(), path, header.data(), header.size(), "dimension header"));
  std::vector<int64_t> shape;
  uint64_t count = 1;
  for (int d = 0; d < dims; ++d) {
    uint32_t extent = big_endian_u32(&header[4 * d]);
    shape.push_back(extent);
    count *= extent;
    if (count > kMaxIdxElements) {
      return invalid_argument_error(
          "idx file {}: dimensions {} claim more than {} elements; the header is corrupt", path,
          fmt::join(shape, "x"), kMaxIdxElements);
    }
  }
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(type));
  size_t width = out.element_size();
  auto* data = static_cast<uint8_t*>(out.data_ptr());
  COHORT_RETURN_IF_ERROR(read_exact(file.get(), path, data, count * width,
                                    fmt::format("data of shape {}", fmt::join(shape, "x")).c_str()));
  to_host_order(data, count, width);
  uint8_t extra = 0;
  if (gzread(file.get(), &extra, 1) > 0) {
    return data_loss_error(
        "idx file {}: trailing bytes after the {} elements of shape {}; the header is wrong", path, count,
        fmt::join(shape, "x"));
  }
  return out;
}

StatusOr<TensorDataset> read_idx_dataset_u8(const std::string& images_path, const std::string& labels_path) {
  COHORT_ASSIGN_OR_RETURN(at::Tensor images, read_idx_file(images_path));
  COHORT_ASSIGN_OR_RETURN(at::Tensor labels, read_idx_file(labels_path));
  if (images.dim() != 3 || images.scalar_type() != at::kByte) {
    return invalid_argument_error(
        "idx image file {}: expected 3 dimensions (N×H×W) of u8, got shape {} of {}", images_path,
        fmt::join(images.sizes(), "x"), at::toString(images.scalar_type()));
  }
  if (labels.dim() != 1 || labels.scalar_type() != at::kByte) {
    return invalid_argument_error("idx label file {}: expected 1 dimension (N) of u8, got shape {} of {}",
                                  labels_path, fmt::join(labels.sizes(), "x"),
                                  at::toString(labels.scalar_type()));
  }
  if (images.size(0) != labels.size(0)) {
    return invalid_argument_error("idx files disagree: {} holds {} images but {} holds {} labels",
                                  images_path, images.size(0), labels_path, labels.size(0));
  }
  return TensorDataset{images.unsqueeze(1), labels.to(at::kLong)};
}

TensorDataset scale_images(const TensorDataset& data) {
  if (!data.inputs.defined() || data.inputs.scalar_type() != at::kByte) return data;
  return TensorDataset{data.inputs.to(at::kFloat).div_(255.0).contiguous(), data.targets};
}

StatusOr<TensorDataset> read_idx_dataset(const std::string& images_path, const std::string& labels_path) {
  COHORT_ASSIGN_OR_RETURN(TensorDataset raw, read_idx_dataset_u8(images_path, labels_path));
  return scale_images(raw);
}

StatusOr<TensorDataset> read_fashion_mnist_u8(bool train) {
  const std::string prefix = train ? "train" : "t10k";
  return read_idx_dataset_u8(fashion_mnist_path(prefix + "-images-idx3-ubyte.gz"),
                             fashion_mnist_path(prefix + "-labels-idx1-ubyte.gz"));
}

StatusOr<TensorDataset> read_fashion_mnist(bool train) {
  COHORT_ASSIGN_OR_RETURN(TensorDataset raw, read_fashion_mnist_u8(train));
  return scale_images(raw);
}

}  // namespace cohort::train
