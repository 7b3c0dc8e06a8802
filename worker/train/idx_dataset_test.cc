#include "worker/train/idx_dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/train/synthetic_dataset.h"

namespace cohort::train {
namespace {

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

void put_u32(std::vector<uint8_t>* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<uint8_t>(v >> shift));
}

// An idx file: magic (0, 0, type, dims), big-endian dimensions, then `payload`.
std::vector<uint8_t> idx_bytes(uint8_t type, const std::vector<uint32_t>& dims,
                               const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) put_u32(&out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void write_plain(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

// Two 2×3 "images" with pixel values 0..11 and their labels 7, 3.
void write_tiny_pair(const std::string& images, const std::string& labels, bool gz) {
  std::vector<uint8_t> pixels;
  for (uint8_t v = 0; v < 12; ++v) pixels.push_back(v == 11 ? 255 : v);
  auto image_bytes = idx_bytes(0x08, {2, 2, 3}, pixels);
  auto label_bytes = idx_bytes(0x08, {2}, {7, 3});
  if (gz) {
    write_gz(images, image_bytes);
    write_gz(labels, label_bytes);
  } else {
    write_plain(images, image_bytes);
    write_plain(labels, label_bytes);
  }
}

TEST(IdxDatasetTest, ReadsGzipAndPlainFiles) {
  for (bool gz : {true, false}) {
    std::string images = temp_path(gz ? "img.gz" : "img"), labels = temp_path(gz ? "lbl.gz" : "lbl");
    write_tiny_pair(images, labels, gz);
    auto ds = read_idx_dataset(images, labels);
    ASSERT_TRUE(ds.ok()) << ds.status().to_string();
    EXPECT_EQ(ds->inputs.sizes(), (std::vector<int64_t>{2, 1, 2, 3}));
    EXPECT_EQ(ds->inputs.scalar_type(), at::kFloat);
    EXPECT_FLOAT_EQ(ds->inputs[0][0][0][1].item<float>(), 1.0f / 255.0f);
    EXPECT_FLOAT_EQ(ds->inputs[1][0][1][2].item<float>(), 1.0f);
    EXPECT_EQ(ds->targets.scalar_type(), at::kLong);
    EXPECT_EQ(ds->targets[0].item<int64_t>(), 7);
    EXPECT_EQ(ds->targets[1].item<int64_t>(), 3);
  }
}

TEST(IdxDatasetTest, ReadsBigEndianMultiByteElements) {
  std::string path = temp_path("ints.gz");
  std::vector<uint8_t> payload;
  put_u32(&payload, 0x01020304u);
  put_u32(&payload, 7u);
  write_gz(path, idx_bytes(0x0C, {2}, payload));
  auto t = read_idx_file(path);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->scalar_type(), at::kInt);
  EXPECT_EQ((*t)[0].item<int32_t>(), 0x01020304);
  EXPECT_EQ((*t)[1].item<int32_t>(), 7);
}

TEST(IdxDatasetTest, MissingFileNamesThePath) {
  auto t = read_idx_file(temp_path("does-not-exist.gz"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("does-not-exist.gz"), std::string::npos) << t.status().message();
}

TEST(IdxDatasetTest, TruncatedDataIsDataLoss) {
  std::string path = temp_path("short.gz");
  write_gz(path, idx_bytes(0x08, {2, 28, 28}, std::vector<uint8_t>(100, 1)));
  auto t = read_idx_file(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(t.status().message().find("truncated"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("short.gz"), std::string::npos) << t.status().message();
}

TEST(IdxDatasetTest, BadMagicAndTrailingBytesAreErrors) {
  std::string path = temp_path("bad.gz");
  write_gz(path, {1, 2, 3, 4, 5});
  auto t = read_idx_file(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("magic"), std::string::npos) << t.status().message();

  write_gz(path, idx_bytes(0x07, {1}, {0}));
  t = read_idx_file(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("element type 0x07"), std::string::npos) << t.status().message();

  write_gz(path, idx_bytes(0x08, {1}, {0, 9}));
  t = read_idx_file(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("trailing"), std::string::npos) << t.status().message();
}

TEST(IdxDatasetTest, CountMismatchNamesBothFiles) {
  std::string images = temp_path("img3.gz"), labels = temp_path("lbl3.gz");
  write_gz(images, idx_bytes(0x08, {3, 1, 1}, {1, 2, 3}));
  write_gz(labels, idx_bytes(0x08, {2}, {1, 2}));
  auto ds = read_idx_dataset(images, labels);
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.status().message().find("img3.gz"), std::string::npos) << ds.status().message();
  EXPECT_NE(ds.status().message().find("lbl3.gz"), std::string::npos) << ds.status().message();
}

TEST(IdxDatasetTest, ReadsFashionMnistTestSplit) {
  struct stat st;
  if (stat(fashion_mnist_path("t10k-images-idx3-ubyte.gz").c_str(), &st) != 0) {
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  }
  auto ds = read_fashion_mnist(/*train=*/false);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  EXPECT_EQ(ds->inputs.sizes(), (std::vector<int64_t>{10000, 1, 28, 28}));
  EXPECT_EQ(ds->targets.sizes(), (std::vector<int64_t>{10000}));
  EXPECT_GE(ds->inputs.min().item<float>(), 0.0f);
  EXPECT_LE(ds->inputs.max().item<float>(), 1.0f);
  EXPECT_GT(ds->inputs.max().item<float>(), 0.9f);
  EXPECT_EQ(ds->targets.min().item<int64_t>(), 0);
  EXPECT_EQ(ds->targets.max().item<int64_t>(), 9);
  // Fashion-MNIST's test split is balanced: 1000 per class.
  EXPECT_EQ(ds->targets.eq(4).sum().item<int64_t>(), 1000);

  // The u8 reading, cut first and scaled after, gives exactly the float reading's samples.
  auto raw = read_fashion_mnist_u8(/*train=*/false);
  ASSERT_TRUE(raw.ok()) << raw.status().to_string();
  EXPECT_EQ(raw->inputs.scalar_type(), at::kByte);
  EXPECT_EQ(raw->inputs.sizes(), ds->inputs.sizes());
  at::Tensor picked = at::tensor({9999, 3, 5000, 3}, at::kLong);
  TensorDataset scaled = scale_images(raw->select(picked));
  EXPECT_EQ(scaled.inputs.scalar_type(), at::kFloat);
  EXPECT_TRUE(scaled.inputs.equal(ds->inputs.index_select(0, picked)));
  EXPECT_TRUE(scaled.targets.equal(ds->targets.index_select(0, picked)));
  // Already float: unchanged.
  EXPECT_TRUE(scale_images(scaled).inputs.is_same(scaled.inputs));
}

TEST(SyntheticDatasetTest, DeterministicShapesAndRange) {
  SyntheticDatasetOptions options;
  options.size = 50;
  options.sample_shape = {3, 4};
  options.num_classes = 5;
  options.seed = 9;
  TensorDataset a = make_synthetic_dataset(options), b = make_synthetic_dataset(options);
  EXPECT_EQ(a.inputs.sizes(), (std::vector<int64_t>{50, 3, 4}));
  EXPECT_EQ(a.size(), 50);
  EXPECT_TRUE(a.inputs.equal(b.inputs));
  EXPECT_TRUE(a.targets.equal(b.targets));
  EXPECT_GE(a.inputs.min().item<float>(), 0.0f);
  EXPECT_LT(a.inputs.max().item<float>(), 1.0f);
  EXPECT_EQ(a.targets.max().item<int64_t>(), 4);
  options.seed = 10;
  EXPECT_FALSE(make_synthetic_dataset(options).inputs.equal(a.inputs));
}

}  // namespace
}  // namespace cohort::train
