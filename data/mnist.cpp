// data/mnist.cpp: the IDX reader and MNIST / FashionMNIST.
#include "data/mnist.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "data/gzip_file.h"
#include "ops/ops.h"

namespace kiln::data {
namespace {

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

// root/name.gz, else root/name; an Error naming both and how to get them when neither exists.
std::string find_file(const std::string& root, const std::string& name, const char* dataset,
                      const char* install_hint) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(root) / (name + ".gz"), plain = fs::path(root) / name;
  std::error_code ec;
  if (fs::exists(gz, ec)) return gz.string();
  if (fs::exists(plain, ec)) return plain.string();
  KILN_FAIL("{}: missing file '{}' (nor '{}'); {}", dataset, gz.string(), plain.string(),
            install_hint);
}

}  // namespace

IdxArray read_idx(const std::string& path, uint32_t magic) {
  IdxArray a;
  a.bytes = read_file_maybe_gzip(path);
  const size_t n = a.bytes.size();
  KILN_CHECK(n >= 4, "IDX '{}': {} bytes, too short for the 4-byte magic number", path, n);
  const uint32_t got = read_be32(a.bytes.data());
  KILN_CHECK(got == magic,
             "IDX '{}': magic number 0x{:08x}, expected 0x{:08x} (unsigned bytes, rank {}); is it "
             "the right file?",
             path, got, magic, magic & 0xff);
  const size_t rank = magic & 0xff;
  a.offset = 4 + 4 * rank;
  KILN_CHECK(n >= a.offset, "IDX '{}': {} bytes, too short for the header of {} dims ({} bytes)",
             path, n, rank, a.offset);
  uint64_t numel = 1;
  for (size_t d = 0; d < rank; ++d) {
    const uint32_t dim = read_be32(a.bytes.data() + 4 + 4 * d);
    a.dims.push_back(dim);
    numel *= dim;  // at most three factors below 2^32 of a file that fits in memory: checked below
    KILN_CHECK(numel <= n, "IDX '{}': dims so far {} need more bytes than the file's {}", path,
               fmt::format("{}", fmt::join(a.dims, " x ")), n);
  }
  KILN_CHECK(n - a.offset == numel,
             "IDX '{}': {} bytes of data after the {}-byte header, expected {} ({}); the file is "
             "truncated or has trailing bytes",
             path, n - a.offset, a.offset, numel, fmt::format("{}", fmt::join(a.dims, " x ")));
  return a;
}

MNIST::MNIST(const std::string& root, bool train)
    : MNIST(root, train, "MNIST", "pass the folder that holds the MNIST files as root") {}

FashionMNIST::FashionMNIST(const std::string& root, bool train)
    : MNIST(
          root, train, "FashionMNIST",
          "install it with `apt-get install dataset-fashion-mnist`, or pass the folder that holds "
          "the files as root") {}

MNIST::MNIST(const std::string& root, bool train, const char* name, const char* install_hint)
    : name_(name) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string images_path =
      find_file(root, prefix + "-images-idx3-ubyte", name, install_hint);
  const std::string labels_path =
      find_file(root, prefix + "-labels-idx1-ubyte", name, install_hint);
  auto images = std::make_shared<IdxArray>(read_idx(images_path, kIdxImagesMagic));
  auto labels = std::make_shared<IdxArray>(read_idx(labels_path, kIdxLabelsMagic));
  KILN_CHECK(images->dims[1] == kRows && images->dims[2] == kCols,
             "{}: '{}' holds {} x {} images, expected {} x {}", name, images_path, images->dims[1],
             images->dims[2], kRows, kCols);
  KILN_CHECK(images->dims[0] == labels->dims[0], "{}: '{}' holds {} images but '{}' {} labels",
             name, images_path, images->dims[0], labels_path, labels->dims[0]);
  for (int64_t i = 0; i < labels->dims[0]; ++i) {
    KILN_CHECK(labels->data()[i] < kClasses, "{}: '{}': label {} at index {} is not in [0, {})",
               name, labels_path, labels->data()[i], i, kClasses);
  }
  size_ = images->dims[0];
  images_ = std::move(images);
  labels_ = std::move(labels);
}

const uint8_t* MNIST::image_bytes(int64_t index) const {
  check_index(name_, index, size_);
  return images_->data() + index * kRows * kCols;
}

uint8_t MNIST::label(int64_t index) const {
  check_index(name_, index, size_);
  return labels_->data()[index];
}

Tensor MNIST::data() const {
  Tensor t = empty({size_, kRows, kCols}, kUInt8);
  if (size_ > 0) std::memcpy(t.data_ptr<uint8_t>(), images_->data(), static_cast<size_t>(size_ * kRows * kCols));
  return t;
}

Tensor MNIST::targets() const {
  Tensor t = empty({size_}, kInt64);
  std::copy(labels_->data(), labels_->data() + size_, t.data_ptr<int64_t>());
  return t;
}

Example MNIST::get(int64_t index) const {
  Example batch = get_batch({index});
  return {batch.data[0], batch.target[0]};
}

Example MNIST::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t batch = static_cast<int64_t>(indices.size());
  Tensor data = empty({batch, 1, kRows, kCols}, kFloat32);
  Tensor target = empty({batch}, kInt64);
  float* x = data.data_ptr<float>();
  int64_t* y = target.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const uint8_t* pixels = image_bytes(indices[b]);
    // x / 255 in float32, rounded once (as PyTorch's ToTensor); a loop the compiler vectorizes.
    float* row = x + b * kRows * kCols;
    for (int64_t p = 0; p < kRows * kCols; ++p) row[p] = static_cast<float>(pixels[p]) / 255.0f;
    y[b] = labels_->data()[indices[b]];
  }
  return {data, target};
}

}  // namespace kiln::data
