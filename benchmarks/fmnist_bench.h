// fmnist_bench.h: what bench_mlp_fmnist.cpp and bench_cnn_fmnist.cpp share: the training epoch and
// test pass of BENCHMARKS.md "Fashion-MNIST", peak RSS, and the JSON result line (the same keys as
// the LibTorch anchors, benchmarks/anchors/fmnist_anchor.h).
//
// Data comes from Kiln's data::FashionMNIST (Debian's dataset-fashion-mnist, read gzipped) through
// a data::DataLoader: batches of 128, a fresh seeded shuffle each epoch, the last partial batch
// kept (469 steps), each batch float [B, 1, 28, 28] with pixels / 255. A step is zero_grad, mean
// cross-entropy, backward, optimizer step; only the training loop is timed.
#pragma once

#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "bench_util.h"

namespace fmnist_bench {

constexpr int64_t kBatch = 128;
constexpr uint64_t kSeed = 0;

using kiln_bench::median;
using kiln_bench::peak_rss_mib;

struct Options {
  int epochs = 0;
  std::string root = kiln::data::FashionMNIST::kDefaultRoot;
  kiln::Device device = kiln::Device::cpu();  // --device cuda: the model and each batch on the GPU
};

// Parses --epochs N and --data DIR (the flags of the anchors); exits with a usage line on anything
// else.
inline Options parse_args(int argc, char** argv, int default_epochs) {
  Options options{.epochs = default_epochs};
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
    } else if (arg == "--device" && i + 1 < argc) {
      try {
        options.device = kiln::Device::parse(argv[++i]);
      } catch (const std::exception& err) {
        std::fprintf(stderr, "%s: %s\n", argv[0], err.what());
        std::exit(2);
      }
    } else {
      std::fprintf(stderr, "usage: %s [--epochs %d] [--data %s] [--device cpu|cuda]\n", argv[0], default_epochs,
                   kiln::data::FashionMNIST::kDefaultRoot);
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
  }
  return options;
}

// Trains net (already on options.device) for options.epochs epochs with `optimizer`, tests it, and
// prints the one JSON result line. Returns the process exit status.
template <typename Net, typename Optimizer>
int run(const char* bench, Net& net, Optimizer& optimizer, const Options& options) {
  using Clock = std::chrono::steady_clock;
  try {
    kiln::data::DataLoader train(kiln::data::FashionMNIST::train(options.root),
                                 {.batch_size = kBatch, .shuffle = true, .seed = kSeed});
    std::vector<double> seconds;
    double loss_final = 0;
    int64_t steps = 0;
    for (int epoch = 0; epoch < options.epochs; ++epoch) {
      net.train();
      steps = 0;
      kiln::Tensor loss;
      Clock::time_point start = Clock::now();
      for (auto& [x, y] : train) {
        optimizer.zero_grad();
        loss = kiln::nn::cross_entropy(net.forward(x.to(options.device)), y.to(options.device));
        loss.backward();
        optimizer.step();
        ++steps;
      }
      loss_final = loss.template item<double>();
      seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }

    kiln::NoGradGuard no_grad;
    net.eval();
    kiln::data::DataLoader test(kiln::data::FashionMNIST::test(options.root), {.batch_size = 1000});
    int64_t correct = 0, total = 0;
    for (auto& [x, y] : test) {
      correct += net.forward(x.to(options.device)).argmax(1).eq(y.to(options.device)).sum().template item<int64_t>();
      total += y.size(0);
    }
    double accuracy = static_cast<double>(correct) / static_cast<double>(total);

    std::string per_epoch;
    for (double s : seconds) {
      if (!per_epoch.empty()) per_epoch += ',';
      per_epoch += std::to_string(s);
    }
    std::printf(
        "{\"bench\":\"%s\",\"impl\":\"kiln\",\"device\":\"%s\",\"threads\":%d,"
        "\"epochs\":%d,"
        "\"steps_per_epoch\":%lld,\"s_per_epoch\":[%s],\"s_epoch_median\":%.4f,"
        "\"loss_final\":%.4f,\"test_acc\":%.4f,\"peak_rss_mib\":%.1f}\n",
        bench, options.device.str().c_str(), kiln::get_num_threads(), options.epochs, static_cast<long long>(steps),
        per_epoch.c_str(), median(seconds), loss_final, accuracy, peak_rss_mib());
    std::fflush(stdout);
  } catch (const std::exception& err) {
    std::fprintf(stderr, "%s: %s\n", bench, err.what());
    return 1;
  }
  return 0;
}

}  // namespace fmnist_bench
