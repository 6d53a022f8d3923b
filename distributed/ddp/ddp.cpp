// distributed/ddp/ddp.cpp: the reducer behind DistributedDataParallel (see ddp.h for the picture).
#include "distributed/ddp/ddp.h"

#include <chrono>

#include "autograd/autograd.h"
#include "core/grad_mode.h"
#include "distributed/comm/comms_logger.h"
#include "ops/ops.h"

namespace kiln::distributed {

struct DistributedDataParallel::Reducer {
  struct Bucket {
    std::vector<size_t> params;    // indices into Reducer::params
    Tensor flat;
    size_t pending = 0;  // gradients still to arrive in this backward
    Work work;
    bool launched = false;
  };

  Communicator& comm;
  const DDPOptions& options;
  std::vector<Tensor> params;
  std::vector<std::string> names;
  std::vector<size_t> bucket_of;  // per parameter: its bucket
  std::vector<int64_t> offset_of;  // per parameter: where its gradient starts in the bucket's flat buffer
  std::vector<Bucket> buckets;
  std::vector<uint64_t> hooks;
  std::vector<bool> ready;
  bool sync = true;
  bool in_backward = false;
  size_t next_to_launch = 0;
  Stats stats;

  Reducer(Communicator& c, const DDPOptions& o, const std::vector<std::pair<std::string, Tensor>>& named)
      : comm(c), options(o) {
    for (const auto& [name, p] : named) {
      if (!p.requires_grad()) continue;
      params.push_back(p);
      names.push_back(name);
    }
    bucket_of.assign(params.size(), 0);
    offset_of.assign(params.size(), 0);
    ready.assign(params.size(), false);
    // Reverse order: backward produces the last layer's gradients first.
    const double cap = options.bucket_cap_mb * 1024 * 1024;
    int64_t bucket_numel = 0;
    for (size_t k = params.size(); k-- > 0;) {
      const Tensor& p = params[k];
      const bool fits = !buckets.empty() && params[buckets.back().params.front()].dtype() == p.dtype() &&
                        params[buckets.back().params.front()].device() == p.device() &&
                        static_cast<double>((bucket_numel + p.numel()) * p.element_size()) <= cap;
      if (!fits) {
        buckets.emplace_back();
        bucket_numel = 0;
      }
      Bucket& b = buckets.back();
      b.params.push_back(k);
      bucket_of[k] = buckets.size() - 1;
      offset_of[k] = bucket_numel;
      bucket_numel += p.numel();
    }
    for (auto& b : buckets) {
      const Tensor& last = params[b.params.back()];
      b.flat = zeros({offset_of[b.params.back()] + last.numel()}, TensorOptions(last.dtype()).device(last.device()));
    }
    for (size_t k = 0; k < params.size(); ++k) {
      hooks.push_back(params[k].register_post_accumulate_grad_hook([this, k](const Tensor&) { grad_ready(k); }));
    }
  }

  ~Reducer() {
    for (size_t k = 0; k < params.size(); ++k) params[k].remove_post_accumulate_grad_hook(hooks[k]);
  }

  Tensor slot(size_t k) const { return buckets[bucket_of[k]].flat.narrow(0, offset_of[k], params[k].numel()); }

  void grad_ready(size_t k) {
    if (!sync) return;
    // The buckets have the dtype and device the parameters had at construction; a copy into them
    // would convert silently (float64 gradients through float32, say).
    const Tensor& flat = buckets[bucket_of[k]].flat;
    const Tensor& grad = params[k].grad();
    KILN_CHECK(grad.dtype() == flat.dtype() && grad.device() == flat.device(),
               "DistributedDataParallel: parameter '{}' has a {} gradient on {}, but it was {} on {} when "
               "DistributedDataParallel was built; call module.to(...) before wrapping the module, as PyTorch "
               "requires",
               names[k], dtype_name(grad.dtype()), grad.device().str(), dtype_name(flat.dtype()), flat.device().str());
    if (!in_backward) {  // the first gradient of this backward
      in_backward = true;
      std::fill(ready.begin(), ready.end(), false);
      for (auto& b : buckets) {
        b.pending = b.params.size();
        b.launched = false;
        b.work = Work();
      }
      next_to_launch = 0;
      stats = Stats();
      autograd::queue_callback([this] { finish(); });
    }
    if (ready[k]) return;
    ready[k] = true;
    {
      NoGradGuard no_grad;
      slot(k).copy_(params[k].grad().reshape({-1}));
    }
    Bucket& b = buckets[bucket_of[k]];
    if (--b.pending == 0 && options.overlap) launch_ready();
  }

  // Starts the complete buckets in bucket order, as far as the first incomplete one.
  void launch_ready() {
    while (next_to_launch < buckets.size() && buckets[next_to_launch].pending == 0) {
      launch(buckets[next_to_launch++]);
      if (in_backward) ++stats.buckets_started_during_backward;
    }
  }

  void launch(Bucket& b) {
    CommCaller caller("DistributedDataParallel");
    b.work = comm.all_reduce(b.flat, ReduceOp::Avg, /*async_op=*/true);
    b.launched = true;
  }

  void wait_launched() {
    for (auto& b : buckets) {
      if (b.launched) b.work.wait();
    }
  }

  // Runs when backward has finished with every node.
  void finish() {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> unused;
    for (size_t k = 0; k < params.size(); ++k) {
      if (!ready[k]) unused.push_back(names[k]);
    }
    in_backward = false;  // from here on, nothing counts as started during backward
    if (!unused.empty()) {
      if (!options.find_unused_parameters) {
        wait_launched();  // the other ranks wait for these too
        std::string list;
        for (size_t i = 0; i < unused.size() && i < 20; ++i) list += (i ? ", " : "") + unused[i];
        if (unused.size() > 20) list += fmt::format(", ... ({} in all)", unused.size());
        KILN_FAIL("DistributedDataParallel: these parameters received no gradient in this backward: {}. If the model "
                  "leaves some parameters unused in a step, construct it with find_unused_parameters = true",
                  list);
      }
      NoGradGuard no_grad;
      for (size_t k = 0; k < params.size(); ++k) {
        if (ready[k]) continue;
        // Unused in this backward: the rank contributes the gradient it already holds (accumulated
        // under no_sync, say), as PyTorch's reducer does, or zeros if it holds none.
        const Tensor& g = params[k].grad();
        if (g.defined()) slot(k).copy_(g.reshape({-1}));
        else slot(k).zero_();
        ready[k] = true;
        --buckets[bucket_of[k]].pending;
      }
    }
    launch_ready();
    wait_launched();
    // With find_unused_parameters, which parameters had a gradient on any rank (one small all-reduce
    // after the buckets, on every rank): one that had none anywhere keeps an undefined .grad(), as in
    // PyTorch, so an optimizer skips it instead of applying momentum or weight decay to zeros.
    std::vector<int32_t> had_grad(params.size(), 1);
    if (options.find_unused_parameters) {
      for (size_t k = 0; k < params.size(); ++k) had_grad[k] = params[k].grad().defined() ? 1 : 0;
      Tensor any = from_vector<int32_t>(had_grad).to(comm.device());  // NCCL: on its GPU
      comm.all_reduce(any, ReduceOp::Max);
      had_grad = any.to_vector<int32_t>();
    }
    NoGradGuard no_grad;
    for (size_t k = 0; k < params.size(); ++k) {
      Tensor averaged = slot(k).view(params[k].sizes());
      Tensor g = params[k].grad();
      if (g.defined()) g.copy_(averaged);
      else if (had_grad[k]) params[k].set_grad(averaged.clone());
    }
    stats.wait_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

namespace {

// One line per parameter (name, dtype, shape, requires_grad) and per buffer.
std::vector<std::string> describe_model(const nn::Module& module) {
  std::vector<std::string> lines;
  for (const auto& [name, p] : module.named_parameters()) {
    lines.push_back(fmt::format("parameter {}: {} {}{}", name, dtype_name(p.dtype()), p.sizes().str(),
                                p.requires_grad() ? "" : " (requires_grad false)"));
  }
  for (const auto& [name, b] : module.named_buffers()) {
    lines.push_back(fmt::format("buffer {}: {} {}", name, dtype_name(b.dtype()), b.sizes().str()));
  }
  return lines;
}

}  // namespace

// The broadcast and the buckets copy by element count, so [2, 3] against [3, 2], or a different
// parameter frozen on one rank, would mix values silently. On a mismatch, rank 0's lines are
// broadcast so that every rank names the first difference, and every rank throws.
void verify_same_model(Communicator& comm, const nn::Module& module, const char* who) {
  const std::vector<std::string> mine = describe_model(module);
  std::string text;
  for (const auto& line : mine) text += line + "\n";
  if (same_on_every_rank(comm, text)) return;
  // On the communicator's device (NCCL carries only tensors on its GPU).
  Tensor length = from_vector<int64_t>({static_cast<int64_t>(text.size())}).to(comm.device());
  comm.broadcast(length, 0);
  Tensor chars = zeros({length.item<int64_t>()}, TensorOptions(kInt32).device(comm.device()));
  if (comm.rank() == 0) chars.copy_(from_vector<int32_t>(std::vector<int32_t>(text.begin(), text.end())));
  comm.broadcast(chars, 0);
  std::vector<std::string> theirs(1);
  for (int32_t c : chars.to_vector<int32_t>()) {
    if (c == '\n') theirs.emplace_back();
    else theirs.back() += static_cast<char>(c);
  }
  theirs.pop_back();
  size_t i = 0;
  while (i < mine.size() && i < theirs.size() && mine[i] == theirs[i]) ++i;
  if (i == mine.size() && i == theirs.size()) {
    KILN_FAIL("{}: the ranks' models differ (another rank's parameters or buffers do not match rank 0's; its "
              "Error names the difference); build the same model on every rank", who);
  }
  KILN_FAIL("{}: the ranks' models differ: rank 0 has {}, rank {} has {}; build the same model on every rank, "
            "with the same parameters trainable, as PyTorch requires",
            who, i < theirs.size() ? "'" + theirs[i] + "'" : "nothing more", comm.rank(),
            i < mine.size() ? "'" + mine[i] + "'" : "nothing more");
}

DistributedDataParallel::DistributedDataParallel(nn::Module& module, std::shared_ptr<Communicator> comm,
                                                 DDPOptions options)
    : module_(module), comm_(std::move(comm)), options_(options) {
  KILN_CHECK(comm_ != nullptr, "DistributedDataParallel: the communicator is null; pass distributed::init()");
  KILN_CHECK(options_.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be > 0, not {}",
             options_.bucket_cap_mb);
  register_module("module", module_);
  verify_same_model(*comm_, module_, "DistributedDataParallel");
  {
    NoGradGuard no_grad;  // rank 0's values everywhere, as PyTorch does at construction
    for (const auto& p : module_.parameters()) comm_->broadcast(p, 0);
    for (const auto& b : module_.buffers()) comm_->broadcast(b, 0);
  }
  reducer_ = std::make_unique<Reducer>(*comm_, options_, module_.named_parameters());
}

DistributedDataParallel::~DistributedDataParallel() = default;

Tensor DistributedDataParallel::forward(const Tensor& input) {
  if (options_.broadcast_buffers) {
    NoGradGuard no_grad;
    for (const auto& b : module_.buffers()) comm_->broadcast(b, 0);
  }
  return module_(input);
}

DistributedDataParallel::NoSync::NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.reducer_->sync) {
  ddp_.reducer_->sync = false;
}
DistributedDataParallel::NoSync::~NoSync() { ddp_.reducer_->sync = previous_; }

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : reducer_->buckets) {
    out.emplace_back();
    for (size_t k : b.params) out.back().push_back(reducer_->names[k]);
  }
  return out;
}

DistributedDataParallel::Stats DistributedDataParallel::last_stats() const { return reducer_->stats; }

}  // namespace kiln::distributed
