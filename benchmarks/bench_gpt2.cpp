// bench_gpt2: BENCHMARKS.md's "gpt2_124m" GPU workload: GPT-2 124M (12 layers, 12 heads, 768 wide,
// context 1024, vocabulary 50257 padded to 50304, tied head, tanh GELU, no dropout) trained on
// synthetic token ids, batch 16, under a bfloat16 autocast scope, with the fused AdamW step
// (lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1). Anchor: benchmarks/anchors/torch_gpt2.py,
// the same model in PyTorch with scaled_dot_product_attention and AdamW(fused=True).
//
// A timed step: draw (B, T+1) token ids on the host and copy them over, forward under autocast, mean
// cross-entropy, zero_grad, backward, optimizer step, loss.item() (which waits for the GPU). The first
// --warmup steps are not timed. Prints one JSON line: ms_per_step (median), tokens_per_s, the model
// FLOPs per token and MFU against the H100 SXM's dense bf16 peak (989.4 TFLOP/s), the losses and the
// peak of Kiln's device allocator.
//
// FLOPs per token, as nanoGPT's estimate_mfu counts them: 6 N for the matmuls of forward and backward
// (N = the parameters without the position embedding) plus 12 L T C for attention's two T x T
// products, forward and backward.
//
// --breakdown instead times the parts of one block, forward and backward under autocast at the
// run's shapes (the median of 20 repetitions after 3, each ended by a device synchronize), one JSON
// line per part: where a step's time goes. Then the parts outside the blocks: the embeddings (wte
// and wpe), the tied head (x wte^T), the loss over the padded vocabulary from 16-bit logits, and
// the fused AdamW step over the whole model's parameters ("ms_step": no backward). A step is about
// n_layer x block + those. torch_gpt2.py --breakdown times the same parts.
//
// --kernels runs --warmup steps, then one step under cuda::KernelProfiler (cuda/profiler.h: CUPTI's
// record of every kernel and copy the GPU ran), and prints one JSON line per kernel (the 40 with the
// most GPU time: name, calls, ms) and an "(all)" line with the step's total GPU time and its wall
// time (step_ms; where the kernels' sum falls short of it, the GPU waited for the host); the table
// goes to stderr. torch_gpt2.py --kernels prints the same lines from torch.profiler.
//
//   bench_gpt2 [--steps 30] [--warmup 5] [--batch 16] [--seq 1024] [--layers 12]
//              [--autocast bf16|fp16|none] [--no-autocast] [--no-fusion] [--device cuda] [--breakdown]
// --autocast fp16 runs the scope in float16 with a GradScaler (its skipped steps are reported);
// none (or --no-autocast) trains in float32; --no-fusion turns kernel fusion off (set_fusion);
// --checkpoint checkpoints every block's activations (GPT::set_checkpointing); --offload keeps the
// activations saved for backward in pinned host memory (autograd::SaveOnCpu). peak_mem_gib shows
// what the last two save on the device. Every line names the 16-bit attention kernels in use
// (attention_kernels: KILN_CUDA_ATTENTION, or "default"; cuda/attention.cu).
#include <kiln/kiln.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gpt_bench.h"
#include "models/gpt.h"

namespace {

constexpr double kPeakBf16 = 989.4e12;  // H100 SXM dense bf16 tensor-core peak, FLOP/s
constexpr int64_t kVocab = 50257, kPaddedVocab = 50304;

struct Options {
  int64_t steps = 30, warmup = 5, batch = 16, seq = 1024, layers = 12;
  bool fusion = true, breakdown = false, checkpoint = false, offload = false, kernels = false;
  std::string autocast = "bf16";  // bf16, fp16 (with a GradScaler) or none (float32)
  std::string device = "cuda";
};

[[noreturn]] void usage(const char* prog, int code) {
  std::fprintf(stderr,
               "usage: %s [--steps 30] [--warmup 5] [--batch 16] [--seq 1024] [--layers 12] "
               "[--autocast bf16|fp16|none] [--no-autocast] [--no-fusion] [--checkpoint] [--offload] [--device cuda] "
               "[--breakdown] [--kernels]\n",
               prog);
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto number = [&]() -> int64_t {
      if (i + 1 >= argc) usage(argv[0], 2);
      char* end = nullptr;
      const long long v = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || v < 0) {
        std::fprintf(stderr, "%s: bad value '%s' for %s\n", argv[0], argv[i], a.c_str());
        std::exit(2);
      }
      return v;
    };
    if (a == "--steps") o.steps = number();
    else if (a == "--warmup") o.warmup = number();
    else if (a == "--batch") o.batch = number();
    else if (a == "--seq") o.seq = number();
    else if (a == "--layers") o.layers = number();
    else if (a == "--no-autocast") o.autocast = "none";
    else if (a == "--autocast" && i + 1 < argc) o.autocast = argv[++i];
    else if (a == "--no-fusion") o.fusion = false;
    else if (a == "--checkpoint") o.checkpoint = true;
    else if (a == "--offload") o.offload = true;
    else if (a == "--breakdown") o.breakdown = true;
    else if (a == "--kernels") o.kernels = true;
    else if (a == "--device" && i + 1 < argc) o.device = argv[++i];
    else usage(argv[0], a == "--help" || a == "-h" ? 0 : 2);
  }
  if (o.autocast != "bf16" && o.autocast != "fp16" && o.autocast != "none") {
    std::fprintf(stderr, "%s: --autocast takes bf16, fp16 or none, got '%s'\n", argv[0], o.autocast.c_str());
    std::exit(2);
  }
  if (o.steps <= o.warmup || o.batch < 1 || o.seq < 1 || o.seq > 1024 || o.layers < 1) {
    std::fprintf(stderr, "%s: need --steps > --warmup, --batch and --layers >= 1, 1 <= --seq <= 1024\n", argv[0]);
    std::exit(2);
  }
  return o;
}

// Which 16-bit CUDA attention kernels run: KILN_CUDA_ATTENTION (cuda/attention.cu), "default" when unset.
const char* attention_kernels() {
  const char* v = std::getenv("KILN_CUDA_ATTENTION");
  return v != nullptr && *v != '\0' ? v : "default";
}

// The median time in ms of fn() (forward and backward of one part) over 20 runs after 3.
double time_part(const std::function<void()>& fn, kiln::Device device) {
  std::vector<double> ms;
  for (int i = 0; i < 23; ++i) {
    if (device.is_cuda()) kiln::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    if (device.is_cuda()) kiln::cuda::synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    if (i >= 3) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return kiln_bench::median(ms);
}

void breakdown(const Options& o, kiln::Device device) {
  using namespace kiln;
  const int64_t B = o.batch, T = o.seq, C = 768, H = 12;
  manual_seed(0);
  nn::TransformerBlock block(C, H, {.gelu_approximate = "tanh"});
  block.to(device);
  // The activations autocast hands the parts: 16-bit, or float32 without autocast.
  const DType low = o.autocast == "fp16" ? kFloat16 : kBFloat16, act = o.autocast == "none" ? kFloat32 : low;
  Tensor x = randn({B, T, C}, kFloat32).to(device).requires_grad_();
  Tensor q = randn({B, H, T, C / H}, kFloat32).to(device).to(act).requires_grad_();
  Tensor k = randn({B, H, T, C / H}, kFloat32).to(device).to(act).requires_grad_();
  Tensor v = randn({B, H, T, C / H}, kFloat32).to(device).to(act).requires_grad_();
  Tensor h4 = randn({B, T, 4 * C}, kFloat32).to(device).to(act).requires_grad_();
  auto fwd_bwd = [&](const std::function<Tensor()>& f) {
    return [&, f] {
      Tensor y;
      {
        AutocastGuard ac(device, low, o.autocast != "none");
        y = f();
      }
      y.backward(ones_like(y));
    };
  };
  const std::vector<std::pair<const char*, std::function<void()>>> parts = {
      {"block", fwd_bwd([&] { return block.forward(x); })},
      {"ln_1", fwd_bwd([&] { return block.ln_1.forward(x); })},
      {"c_attn", fwd_bwd([&] { return block.attn.c_attn.forward(x); })},
      {"sdpa", fwd_bwd([&] { return scaled_dot_product_attention(q, k, v, {}, 0.0, true); })},
      {"attn", fwd_bwd([&] { return block.attn.forward(x); })},
      {"mlp", fwd_bwd([&] { return block.mlp.forward(x); })},
      {"c_fc", fwd_bwd([&] { return block.mlp.c_fc.forward(x); })},
      {"gelu", fwd_bwd([&] { return gelu(h4, "tanh"); })},
      {"mlp.c_proj", fwd_bwd([&] { return block.mlp.c_proj.forward(h4); })},
      {"residual_add", fwd_bwd([&] { return x + x; })},
  };
  const auto report = [&](const char* name, const char* key, double ms) {
    std::printf("{\"bench\":\"gpt2_124m_breakdown\",\"impl\":\"kiln\",\"part\":\"%s\",\"batch\":%lld,\"seq\":%lld,"
                "\"attention_kernels\":\"%s\",\"%s\":%.3f}\n",
                name, static_cast<long long>(B), static_cast<long long>(T), attention_kernels(), key, ms);
    std::fflush(stdout);
  };
  for (const auto& [name, fn] : parts) report(name, "ms_fwd_bwd", time_part(fn, device));

  // Outside the blocks, with a whole model's parameters (GPT-2 124M's at --layers 12).
  models::GPTConfig config = models::GPTConfig::gpt2();
  config.vocab_size = kPaddedVocab;
  config.n_layer = o.layers;
  models::GPT model(config);
  model.to(device);
  Tensor ids = randint(0, kVocab, {B, T}, kInt64).to(device);
  Tensor targets = randint(0, kVocab, {B, T}, kInt64).to(device);
  Tensor pos = arange(0, T, 1, kInt64, device);
  Tensor logits = randn({B, T, kPaddedVocab}, kFloat32).to(device).to(act);
  logits.requires_grad_();
  const Tensor& wte = model.transformer.wte.weight;
  const std::vector<std::pair<const char*, std::function<void()>>> outside = {
      {"embedding", fwd_bwd([&] { return model.transformer.wte(ids) + model.transformer.wpe(pos); })},
      {"head", fwd_bwd([&] { return nn::linear(x, wte); })},
      {"loss", fwd_bwd([&] { return models::GPT::loss(logits, targets); })},
  };
  for (const auto& [name, fn] : outside) report(name, "ms_fwd_bwd", time_part(fn, device));
  {
    NoGradGuard no_grad;
    for (Tensor& p : model.parameters()) p.set_grad(full_like(p, 1e-3));
  }
  optim::AdamW opt(model.parameters(),
                   {.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .fused = true});
  report("adamw", "ms_step", time_part([&] { opt.step(); }, device));
}

// --kernels: after --warmup steps, one step under cuda::KernelProfiler, one JSON line per kernel (the
// 40 with the most GPU time) and one with the step's total GPU time and wall time.
void kernel_profile(const Options& o, const std::function<void(int64_t)>& run_steps) {
  using namespace kiln;
  run_steps(o.warmup);
  cuda::KernelProfiler prof;
  prof.start();
  const auto t0 = std::chrono::steady_clock::now();
  run_steps(1);  // ends in loss.item(): the GPU's work is done
  const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  prof.stop();
  const auto kernels = prof.kernels();
  for (size_t i = 0; i < kernels.size() && i < 40; ++i) {
    std::string name;  // JSON-escaped: kernel names hold no control characters, but may hold quotes
    for (char c : kernels[i].name) {
      if (c == '"' || c == '\\') name += '\\';
      name += c;
    }
    std::printf("{\"bench\":\"gpt2_124m_kernels\",\"impl\":\"kiln\",\"autocast\":\"%s\",\"kernel\":\"%s\",\"calls\":%lld,"
                "\"ms\":%.4f}\n",
                o.autocast.c_str(), name.c_str(), static_cast<long long>(kernels[i].calls), kernels[i].total_ms);
  }
  std::printf("{\"bench\":\"gpt2_124m_kernels\",\"impl\":\"kiln\",\"autocast\":\"%s\",\"kernel\":\"(all)\","
              "\"kernels\":%zu,\"calls\":%lld,\"ms\":%.4f,\"step_ms\":%.3f}\n",
              o.autocast.c_str(), kernels.size(), [&] {
                long long calls = 0;
                for (const auto& k : kernels) calls += k.calls;
                return calls;
              }(), prof.total_ms(), step_ms);
  std::fflush(stdout);
  std::fputs(prof.table(40).c_str(), stderr);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  const Options o = parse(argc, argv);
  try {
    const Device device = Device::parse(o.device);
    set_fusion(o.fusion);
    if (o.breakdown) {
      breakdown(o, device);
      return 0;
    }
    manual_seed(0);
    models::GPTConfig config = models::GPTConfig::gpt2();
    config.vocab_size = kPaddedVocab;
    config.n_layer = o.layers;
    models::GPT model(config);
    model.to(device);
    model.set_checkpointing(o.checkpoint);
    optim::AdamW opt(model.parameters(),
                     {.lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .fused = true});
    const int64_t params = model.num_parameters();
    const int64_t n = params - config.block_size * config.n_embd;  // without wpe
    const double flops_per_token =
        6.0 * static_cast<double>(n) + 12.0 * static_cast<double>(o.layers * o.seq * config.n_embd);

    // fp16 needs loss scaling (DeepSpeed's dynamic rule, optim/grad_scaler.h); bf16 and float32 do not.
    const DType low = o.autocast == "fp16" ? kFloat16 : kBFloat16;
    optim::GradScaler scaler({.enabled = o.autocast == "fp16"});
    Generator gen(0);
    memory::reset_peak(device);
    const auto next_batch = [&] {
      Tensor ids = randint(0, kVocab, {o.batch, o.seq + 1}, kInt64, &gen).to(device);
      return std::pair{ids.narrow(1, 0, o.seq), ids.narrow(1, 1, o.seq)};
    };
    const gpt_bench::StepOptions step_options{
        .device = device, .autocast = o.autocast != "none", .low = low, .offload = o.offload};
    if (o.kernels) {
      kernel_profile(o, [&](int64_t steps) { gpt_bench::train_steps(model, opt, scaler, steps, steps, next_batch, step_options); });
      return 0;
    }
    const gpt_bench::StepLog log = gpt_bench::train_steps(model, opt, scaler, o.steps, o.warmup, next_batch, step_options);
    const double step_ms = kiln_bench::median(log.ms);
    const double tokens_per_s = static_cast<double>(o.batch * o.seq) / (step_ms / 1e3);
    const double peak_gib = static_cast<double>(memory::stats(device).peak_allocated_bytes) / (1ull << 30);
    std::printf(
        "{\"bench\":\"gpt2_124m\",\"impl\":\"kiln\",\"device\":\"%s\",\"n_layer\":%lld,\"batch\":%lld,\"seq\":%lld,"
        "\"params\":%lld,\"autocast\":\"%s\",\"attention_kernels\":\"%s\",\"fusion\":%s,\"checkpoint\":%s,\"offload\":%s,\"steps\":%lld,\"ms_per_step\":%.2f,"
        "\"tokens_per_s\":%.0f,\"flops_per_token\":%.4g,\"mfu\":%.4f,\"loss_first\":%.4f,\"loss_final\":%.4f,"
        "\"peak_mem_gib\":%.2f,\"skipped_steps\":%lld}\n",
        device.str().c_str(), static_cast<long long>(o.layers), static_cast<long long>(o.batch),
        static_cast<long long>(o.seq), static_cast<long long>(params), o.autocast.c_str(), attention_kernels(),
        o.fusion ? "true" : "false", o.checkpoint ? "true" : "false", o.offload ? "true" : "false",
        static_cast<long long>(o.steps), step_ms, tokens_per_s, flops_per_token,
        flops_per_token * tokens_per_s / kPeakBf16, log.loss_first, log.loss_last, peak_gib,
        static_cast<long long>(scaler.skipped_steps()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_gpt2: %s\n", e.what());
    return 1;
  }
}
