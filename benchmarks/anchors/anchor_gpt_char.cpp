// anchor_gpt_char: the LibTorch anchor for Kiln's "e. gpt_char" benchmark, and the LibTorch
// figures of "f. checkpointing_mem" without checkpointing (LibTorch 1.13 has no C++ activation
// checkpointing; torch_gpt_char.py --checkpoint is that side). Siblings: corpus_anchor.h (the byte
// corpus), CMakeLists.txt and README.md in benchmarks/anchors/; the Kiln counterparts are
// bench_gpt_char and bench_checkpointing_mem; scripts/bench_compare.py runs them side by side.
//
// A GPT-2-style decoder on bytes, as BENCHMARKS.md specifies it. Dimensions:
//   B batch (16), T time (128), C channels (128), H heads (4), D = C / H head size (32),
//   V vocabulary (256), L layers (4; 8 for checkpointing_mem).
// x = wte[idx] + wpe[pos]; L pre-LN blocks x += proj(attn(ln1(x))), x += fc2(gelu(fc(ln2(x))));
// final LayerNorm; logits = x wte^T (tied). Causal attention is written out (LibTorch 1.13 has no
// scaled_dot_product_attention). Init: every >= 2-D parameter N(0, 0.02), LayerNorm weight 1, all
// biases 0. Mean cross-entropy; AdamW lr 3e-4, (0.9, 0.999), eps 1e-8, weight decay 0.1 on all
// parameters. Each step draws B offsets uniform in [0, N-T-1) (torch::randint, generator seeded
// with 0); x = bytes[o:o+T], y = bytes[o+1:o+T+1]. A timed step is batch drawing, forward,
// backward, optimizer step and loss.item(); ms_per_step is the median of steps 11..steps.
//
//   anchor_gpt_char [--bench gpt_char|checkpointing_mem] [--layers N] [--steps N] [--corpus PATH]
//
// --bench gpt_char (default): L 4, 200 steps. --bench checkpointing_mem: L 8, 30 steps, and the
// line carries "ckpt":false. --layers and --steps override either. Without --corpus the corpus is
// built in memory from the installed packages (corpus_anchor.h). Prints one JSON line:
//   {"bench":"gpt_char","impl":"libtorch","device":"cpu","threads":2,"n_layer":4,"steps":200,
//    "ms_per_step":...,"loss_final":...,"loss_first":...,"peak_rss_mib":...,"params":842496}
// loss_final is the loss of the last step, loss_first that of the first; peak_rss_mib is the
// whole process's ru_maxrss.
//
// LibTorch at its best: 2 intra-op threads (its default here would be 1), and the comparison script
// sets OMP_WAIT_POLICY=passive (set it by hand too when running this alone).

#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "corpus_anchor.h"

namespace {

constexpr int kThreads = 2;
constexpr int64_t kVocab = 256;     // V
constexpr int64_t kChannels = 128;  // C
constexpr int64_t kHeads = 4;       // H
constexpr int64_t kContext = 128;   // T
constexpr int64_t kBatch = 16;      // B
constexpr int kWarmupSteps = 10;    // steps 1..10 are not in the median

// One pre-LN transformer block.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kChannels})))),
        qkv(register_module("qkv", torch::nn::Linear(kChannels, 3 * kChannels))),
        proj(register_module("proj", torch::nn::Linear(kChannels, kChannels))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kChannels})))),
        fc(register_module("fc", torch::nn::Linear(kChannels, 4 * kChannels))),
        fc2(register_module("fc2", torch::nn::Linear(4 * kChannels, kChannels))) {}

  // Causal multi-head self-attention: (B, T, C) -> (B, T, C).
  torch::Tensor Attention(const torch::Tensor& x) {
    int64_t b = x.size(0), t = x.size(1);
    int64_t d = kChannels / kHeads;
    std::vector<torch::Tensor> qkv_parts = qkv->forward(x).split(kChannels, /*dim=*/2);
    // (B, T, C) -> (B, H, T, D)
    torch::Tensor q = qkv_parts[0].view({b, t, kHeads, d}).transpose(1, 2);
    torch::Tensor k = qkv_parts[1].view({b, t, kHeads, d}).transpose(1, 2);
    torch::Tensor v = qkv_parts[2].view({b, t, kHeads, d}).transpose(1, 2);
    torch::Tensor att = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(d)));
    torch::Tensor above = torch::ones({t, t}, torch::kBool).triu(1);  // (T, T), true above diagonal
    att = att.masked_fill(above, -std::numeric_limits<float>::infinity()).softmax(-1);
    torch::Tensor y = att.matmul(v).transpose(1, 2).contiguous().view({b, t, kChannels});
    return proj->forward(y);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = x + Attention(ln1->forward(x));
    x = x + fc2->forward(torch::gelu(fc->forward(ln2->forward(x))));  // exact (erf) GELU
    return x;
  }

  torch::nn::LayerNorm ln1;  // weight, bias (C)
  torch::nn::Linear qkv;     // weight (3C, C), bias (3C)
  torch::nn::Linear proj;    // weight (C, C), bias (C)
  torch::nn::LayerNorm ln2;  // weight, bias (C)
  torch::nn::Linear fc;      // weight (4C, C), bias (4C)
  torch::nn::Linear fc2;     // weight (C, 4C), bias (C)
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(int n_layer)
      : wte(register_parameter("wte", torch::empty({kVocab, kChannels}))),
        wpe(register_parameter("wpe", torch::empty({kContext, kChannels}))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(register_module("ln_f",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({kChannels})))) {
    for (int i = 0; i < n_layer; ++i) blocks->push_back(Block());
    torch::NoGradGuard no_grad;
    for (auto& named : named_parameters()) {
      torch::Tensor& p = named.value();
      const std::string& name = named.key();
      if (p.dim() >= 2) {
        p.normal_(0.0, 0.02);
      } else if (name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0) {
        p.fill_(1.0);  // a LayerNorm weight: the only 1-D weights
      } else {
        p.zero_();
      }
    }
  }

  // idx (B, T) int64 -> logits (B, T, V).
  torch::Tensor forward(const torch::Tensor& idx) {
    int64_t t = idx.size(1);
    torch::Tensor x = wte.index_select(0, idx.reshape({-1})).view({idx.size(0), t, kChannels}) +
                      wpe.slice(0, 0, t);
    for (const auto& block : *blocks) x = block->as<Block>()->forward(x);
    return ln_f->forward(x).matmul(wte.t());
  }

  torch::Tensor wte;  // (V, C), also the output head
  torch::Tensor wpe;  // (T, C)
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;  // weight, bias (C)
};
TORCH_MODULE(Gpt);

struct Options {
  std::string bench = "gpt_char";
  int layers = 0;  // 0: the bench's default
  int steps = 0;   // 0: the bench's default
  std::string corpus;
};

int ParsePositive(const char* program, const char* flag, const char* text) {
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value <= 0 || value > 1000000) {
    std::fprintf(stderr, "%s: bad %s value '%s'\n", program, flag, text);
    std::exit(2);
  }
  return static_cast<int>(value);
}

// Parses the flags; fills in the bench's defaults; exits with a usage line on anything else.
Options ParseArgs(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--bench" && i + 1 < argc) {
      options.bench = argv[++i];
    } else if (arg == "--layers" && i + 1 < argc) {
      options.layers = ParsePositive(argv[0], "--layers", argv[++i]);
    } else if (arg == "--steps" && i + 1 < argc) {
      options.steps = ParsePositive(argv[0], "--steps", argv[++i]);
    } else if (arg == "--corpus" && i + 1 < argc) {
      options.corpus = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: %s [--bench gpt_char|checkpointing_mem] [--layers N] [--steps N] "
                   "[--corpus PATH]\n",
                   argv[0]);
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
  }
  bool ckpt_bench = options.bench == "checkpointing_mem";
  if (!ckpt_bench && options.bench != "gpt_char") {
    std::fprintf(stderr, "%s: --bench is gpt_char or checkpointing_mem, not '%s'\n", argv[0],
                 options.bench.c_str());
    std::exit(2);
  }
  if (options.layers == 0) options.layers = ckpt_bench ? 8 : 4;
  if (options.steps == 0) options.steps = ckpt_bench ? 30 : 200;
  return options;
}

// Peak resident set size of the whole process so far, in MiB (ru_maxrss is in KiB on Linux).
double PeakRssMib() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

}  // namespace

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  Options options = ParseArgs(argc, argv);
  torch::set_num_threads(kThreads);
  torch::manual_seed(0);

  std::vector<uint8_t> bytes;
  try {
    bytes = corpus_anchor::Load(options.corpus);
  } catch (const std::exception& err) {
    std::fprintf(stderr, "anchor_gpt_char: %s\n", err.what());
    return 1;
  }
  int64_t n = static_cast<int64_t>(bytes.size());
  torch::Tensor corpus = torch::from_blob(bytes.data(), {n}, torch::kUInt8);  // (N), not copied

  Gpt model(options.layers);
  int64_t params = 0;
  for (const torch::Tensor& p : model->parameters()) params += p.numel();
  // wte (V*C) + wpe (T*C) + ln_f (2C), and per block ln1 and ln2 (2C each), qkv (3C*C + 3C),
  // proj (C*C + C), fc (4C*C + 4C), fc2 (C*4C + C): 842,496 for L = 4.
  constexpr int64_t c = kChannels;
  int64_t per_block =
      2 * c + (3 * c * c + 3 * c) + (c * c + c) + 2 * c + (4 * c * c + 4 * c) + (4 * c * c + c);
  int64_t expected = kVocab * c + kContext * c + 2 * c + options.layers * per_block;
  if (params != expected || (options.layers == 4 && params != 842496)) {
    std::fprintf(stderr, "anchor_gpt_char: %lld parameters, expected %lld\n",
                 static_cast<long long>(params), static_cast<long long>(expected));
    return 1;
  }
  torch::optim::AdamW optimizer(
      model->parameters(),
      torch::optim::AdamWOptions(3e-4).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.1));

  at::Generator generator = at::detail::createCPUGenerator(/*seed_val=*/0);
  torch::Tensor positions = torch::arange(kContext + 1, torch::kInt64);  // (T+1)
  std::vector<double> ms;
  double loss_first = 0, loss_final = 0;
  for (int step = 1; step <= options.steps; ++step) {
    Clock::time_point start = Clock::now();
    torch::Tensor offsets =
        torch::randint(0, n - kContext - 1, {kBatch}, generator, torch::kInt64);  // (B)
    torch::Tensor window =
        corpus.index({offsets.unsqueeze(1) + positions}).to(torch::kInt64);  // (B, T+1)
    torch::Tensor x = window.slice(1, 0, kContext);                          // (B, T)
    torch::Tensor y = window.slice(1, 1, kContext + 1);                      // (B, T)
    optimizer.zero_grad();
    torch::Tensor logits = model->forward(x);  // (B, T, V)
    torch::Tensor loss =
        torch::nn::functional::cross_entropy(logits.view({-1, kVocab}), y.reshape({-1}));
    loss.backward();
    optimizer.step();
    double value = loss.item<double>();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    if (step == 1) loss_first = value;
    loss_final = value;
  }
  std::vector<double> timed(ms.begin() + std::min<size_t>(kWarmupSteps, ms.size() - 1), ms.end());

  std::string ckpt = options.bench == "checkpointing_mem" ? ",\"ckpt\":false" : "";
  std::printf(
      "{\"bench\":\"%s\",\"impl\":\"libtorch\",\"device\":\"cpu\",\"threads\":%d,"
      "\"n_layer\":%d,\"steps\":%d%s,\"ms_per_step\":%.3f,\"loss_final\":%.4f,"
      "\"loss_first\":%.4f,\"peak_rss_mib\":%.1f,\"params\":%lld}\n",
      options.bench.c_str(), torch::get_num_threads(), options.layers, options.steps, ckpt.c_str(),
      Median(timed), loss_final, loss_first, PeakRssMib(), static_cast<long long>(params));
  std::fflush(stdout);
  return 0;
}
