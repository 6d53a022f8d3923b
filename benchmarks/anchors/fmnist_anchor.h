// fmnist_anchor.h: what the two Fashion-MNIST anchors (anchor_mlp_fmnist.cpp,
// anchor_cnn_fmnist.cpp) share: reading the gzipped IDX files with zlib, the training epoch and
// test pass of BENCHMARKS.md "Fashion-MNIST", peak RSS, and the JSON result line. Siblings:
// CMakeLists.txt and README.md in benchmarks/anchors/. The Kiln counterparts (bench_mlp_fmnist,
// bench_cnn_fmnist) use Kiln's own data::FashionMNIST instead; this project must not depend on
// Kiln.
//
// The data is held the way torch::data::datasets::MNIST holds it: images as one float tensor
// [N, 1, 28, 28] with pixels / 255 (no normalisation), labels as int64 [N]. Each epoch draws a
// fresh permutation of the training set (seeded through torch::manual_seed), takes batches of 128
// with the last partial batch kept (60,000 -> 469 steps) and runs zero_grad, mean cross-entropy,
// backward and the optimizer step. Only that loop is timed.

#pragma once

#include <sys/resource.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace fmnist_anchor {

constexpr int kThreads = 2;
constexpr int64_t kBatch = 128;
constexpr const char* kDefaultRoot = "/usr/share/datasets/fashion-mnist";

struct Split {
  torch::Tensor images;  // (N, 1, 28, 28) float32, pixels / 255
  torch::Tensor labels;  // (N) int64
};

// Reads all of a gzipped file into memory; throws naming the file if it cannot.
inline std::vector<uint8_t> ReadGz(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error("cannot open " + path);
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    int n = gzread(file, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      std::string message = gzerror(file, &code);
      gzclose(file);
      throw std::runtime_error("cannot read " + path + ": " + message);
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + n);
  }
  gzclose(file);
  return bytes;
}

// IDX header fields are big-endian 32-bit integers.
inline uint32_t BigEndian32(const std::vector<uint8_t>& bytes, size_t offset) {
  return (uint32_t{bytes[offset]} << 24) | (uint32_t{bytes[offset + 1]} << 16) |
         (uint32_t{bytes[offset + 2]} << 8) | uint32_t{bytes[offset + 3]};
}

// Reads an IDX file of unsigned bytes with the given number of dimensions (magic 0x0000080N);
// returns the dimensions and leaves the payload in *payload.
inline std::vector<int64_t> ReadIdx(const std::string& path, int ndim,
                                    std::vector<uint8_t>* payload) {
  std::vector<uint8_t> bytes = ReadGz(path);
  size_t header = 4 + 4 * static_cast<size_t>(ndim);
  if (bytes.size() < header || BigEndian32(bytes, 0) != 0x0800u + static_cast<uint32_t>(ndim)) {
    throw std::runtime_error(path + ": not an IDX file of " + std::to_string(ndim) +
                             "-D unsigned bytes");
  }
  std::vector<int64_t> dims;
  size_t count = 1;
  for (int d = 0; d < ndim; ++d) {
    dims.push_back(BigEndian32(bytes, 4 + 4 * static_cast<size_t>(d)));
    count *= static_cast<size_t>(dims.back());
  }
  if (bytes.size() != header + count) {
    throw std::runtime_error(path + ": " + std::to_string(bytes.size()) + " bytes, header says " +
                             std::to_string(header + count));
  }
  payload->assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return dims;
}

// Loads "train" or "t10k" from root.
inline Split LoadSplit(const std::string& root, const std::string& prefix) {
  std::vector<uint8_t> pixels, labels;
  std::vector<int64_t> image_dims =
      ReadIdx(root + "/" + prefix + "-images-idx3-ubyte.gz", 3, &pixels);
  std::vector<int64_t> label_dims =
      ReadIdx(root + "/" + prefix + "-labels-idx1-ubyte.gz", 1, &labels);
  if (image_dims[0] != label_dims[0] || image_dims[1] != 28 || image_dims[2] != 28) {
    throw std::runtime_error(root + "/" + prefix + ": image and label files do not match");
  }
  int64_t n = image_dims[0];
  Split split;
  split.images = torch::from_blob(pixels.data(), {n, 1, 28, 28}, torch::kUInt8)
                     .to(torch::kFloat32)
                     .div_(255.0);
  split.labels = torch::from_blob(labels.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return split;
}

// Peak resident set size of the whole process so far, in MiB (ru_maxrss is in KiB on Linux).
inline double PeakRssMib() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

inline double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

struct EpochResult {
  double seconds = 0;
  double loss_last = 0;  // loss of the epoch's last step
  int64_t steps = 0;
};

// One training epoch over a fresh permutation. Returns its wall time (the loop only).
template <typename Model>
EpochResult TrainEpoch(Model& model, torch::optim::Optimizer& optimizer, const Split& train) {
  using Clock = std::chrono::steady_clock;
  model->train();
  EpochResult result;
  Clock::time_point start = Clock::now();
  int64_t n = train.images.size(0);
  torch::Tensor order = torch::randperm(n, torch::kInt64);
  torch::Tensor loss;
  for (int64_t begin = 0; begin < n; begin += kBatch) {
    torch::Tensor index = order.slice(0, begin, std::min(begin + kBatch, n));
    torch::Tensor x = train.images.index_select(0, index);
    torch::Tensor y = train.labels.index_select(0, index);
    optimizer.zero_grad();
    loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    optimizer.step();
    ++result.steps;
  }
  result.loss_last = loss.item<double>();
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

// Fraction of the test set classified correctly (no grad, batches of 1,000).
template <typename Model>
double TestAccuracy(Model& model, const Split& test) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t n = test.images.size(0);
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += 1000) {
    int64_t end = std::min(begin + 1000, n);
    torch::Tensor predicted = model->forward(test.images.slice(0, begin, end)).argmax(1);
    correct += predicted.eq(test.labels.slice(0, begin, end)).sum().template item<int64_t>();
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

struct Options {
  int epochs = 0;
  std::string root = kDefaultRoot;
};

// Parses --epochs N and --data DIR; exits with a usage line on anything else.
inline Options ParseArgs(int argc, char** argv, int default_epochs) {
  Options options;
  options.epochs = default_epochs;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--epochs" && i + 1 < argc) {
      char* end = nullptr;
      long value = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || value <= 0) {
        std::fprintf(stderr, "%s: bad --epochs value '%s'\n", argv[0], argv[i]);
        std::exit(2);
      }
      options.epochs = static_cast<int>(value);
    } else if (arg == "--data" && i + 1 < argc) {
      options.root = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--epochs %d] [--data %s]\n", argv[0], default_epochs,
                   kDefaultRoot);
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
  }
  return options;
}

// Loads the data, trains for options.epochs, tests, and prints the one JSON result line.
template <typename Model>
int Run(const char* bench, Model& model, torch::optim::Optimizer& optimizer,
        const Options& options) {
  Split train, test;
  try {
    train = LoadSplit(options.root, "train");
    test = LoadSplit(options.root, "t10k");
  } catch (const std::exception& err) {
    std::fprintf(stderr, "%s: %s (install Debian's dataset-fashion-mnist, or pass --data DIR)\n",
                 bench, err.what());
    return 1;
  }
  std::vector<double> seconds;
  EpochResult last;
  for (int epoch = 0; epoch < options.epochs; ++epoch) {
    last = TrainEpoch(model, optimizer, train);
    seconds.push_back(last.seconds);
  }
  double accuracy = TestAccuracy(model, test);

  std::string per_epoch;
  for (double s : seconds) {
    per_epoch += (per_epoch.empty() ? "" : ",") + std::to_string(s);
  }
  std::printf(
      "{\"bench\":\"%s\",\"impl\":\"libtorch\",\"device\":\"cpu\","
      "\"threads\":%d,\"epochs\":%d,"
      "\"steps_per_epoch\":%lld,\"s_per_epoch\":[%s],\"s_epoch_"
      "median\":%.4f,\"loss_final\":%.4f,"
      "\"test_acc\":%.4f,\"peak_rss_mib\":%.1f}\n",
      bench, torch::get_num_threads(), options.epochs, static_cast<long long>(last.steps),
      per_epoch.c_str(), Median(seconds), last.loss_last, accuracy, PeakRssMib());
  std::fflush(stdout);
  return 0;
}

}  // namespace fmnist_anchor
