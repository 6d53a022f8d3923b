// data/mnist.h: the IDX file format, and MNIST / Fashion-MNIST read from it.
//
// IDX (LeCun's MNIST format): a big-endian magic 0x000008NN (0x08 = unsigned bytes, NN = rank),
// NN big-endian uint32 dims, then the bytes, row-major. Files are read gzip'd ("...-ubyte.gz") or
// plain ("...-ubyte"). The pixels stay bytes in memory (47 MB for the 60,000 training images, not
// 188 MB of floats); get_batch converts a batch to float32 / 255.
//
//   data::FashionMNIST::train()          // apt-get install dataset-fashion-mnist
//   data::MNIST::test("/data/mnist")     // root is required
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace kiln::data {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned bytes, rank 3
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned bytes, rank 1

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;  // the whole file; the values start at `offset`
  size_t offset = 0;
  const uint8_t* data() const { return bytes.data() + offset; }
};

// Reads an IDX file of unsigned bytes whose magic must be `magic`; checks the exact length.
IdxArray read_idx(const std::string& path, uint32_t magic);

// Images (N, 28, 28) with labels in [0, 10). Sample i: data (1, 28, 28) float32 in [0, 1], target
// int64. get_batch: data (B, 1, 28, 28), target (B).
class MNIST : public Dataset {
 public:
  static constexpr int64_t kRows = 28, kCols = 28, kClasses = 10;

  // Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `root`.
  explicit MNIST(const std::string& root, bool train = true);
  static MNIST train(const std::string& root) { return MNIST(root, true); }
  static MNIST test(const std::string& root) { return MNIST(root, false); }

  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;

  const uint8_t* image_bytes(int64_t index) const;  // 28 * 28 bytes, row-major
  uint8_t label(int64_t index) const;
  // Every image as torchvision's `dataset.data`: uint8 (N, 28, 28), a copy; and every label as its
  // `dataset.targets`: int64 (N).
  Tensor data() const;
  Tensor targets() const;

 protected:
  MNIST(const std::string& root, bool train, const char* name, const char* install_hint);

 private:
  const char* name_;
  int64_t size_ = 0;
  // Shared, so that copies of the dataset are cheap.
  std::shared_ptr<const IdxArray> images_;  // (N, 28, 28)
  std::shared_ptr<const IdxArray> labels_;  // (N)
};

// Zalando's Fashion-MNIST (same format and layout as MNIST), by default from Debian's
// dataset-fashion-mnist package.
class FashionMNIST : public MNIST {
 public:
  static constexpr const char* kDefaultRoot = "/usr/share/datasets/fashion-mnist";
  explicit FashionMNIST(const std::string& root = kDefaultRoot, bool train = true);
  static FashionMNIST train(const std::string& root = kDefaultRoot) {
    return FashionMNIST(root, true);
  }
  static FashionMNIST test(const std::string& root = kDefaultRoot) {
    return FashionMNIST(root, false);
  }
};

}  // namespace kiln::data
