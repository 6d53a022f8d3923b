// distributed/ddp/sync_batch_norm.cpp: the statistics of a training BatchNorm over every rank
// (sync_batch_norm.h says what and how).
#include "distributed/ddp/sync_batch_norm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <any>
#include <vector>

#include "autograd/function.h"
#include "ops/ops.h"

namespace kiln::distributed {

namespace {

// The sum over ranks, every rank keeping it: its backward is the same all-reduce of the gradient
// (each rank's copy feeds its own loss, and the objective is the sum of the ranks' losses).
struct AllReduceSum : autograd::Function<AllReduceSum> {
  static Tensor forward(autograd::AutogradContext* ctx, const Tensor& x, Communicator* comm) {
    ctx->saved_data["comm"] = comm;
    Tensor out = x.contiguous().clone();
    comm->all_reduce(out, ReduceOp::Sum);
    return out;
  }
  static autograd::TensorList backward(autograd::AutogradContext* ctx, autograd::TensorList g) {
    return {AllReduceSum::apply(g[0], std::any_cast<Communicator*>(ctx->saved_data["comm"])), Tensor()};
  }
};

// A per-channel (C) tensor shaped (1, C, 1, ...) to broadcast against a dims-D (N, C, *) input.
Tensor per_channel(const Tensor& c, int64_t dims) {
  std::vector<int64_t> shape(static_cast<size_t>(dims), 1);
  shape[1] = c.size(0);
  return c.reshape(shape);
}

class CollectiveStats final : public nn::BatchNormSync {
 public:
  explicit CollectiveStats(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {}

  Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                    const Tensor& bias, double momentum, double eps) override {
    const char* op = "SyncBatchNorm";
    if (comm_->size() == 1)
      return kiln::batch_norm(input, running_mean, running_var, weight, bias, true, momentum, eps);
    KILN_CHECK(input.dim() >= 2, "{}: expected an input of at least 2 dims (N, C) or (N, C, *), got shape {}", op,
               input.sizes().str());
    KILN_CHECK(input.is_floating_point(), "{}: needs a floating-point input, got {}", op, dtype_name(input.dtype()));
    const int64_t channels = input.size(1), dims = input.dim();
    // The whole batch's values per channel: every rank's, and the same channels on every rank (a
    // mismatch would make the collectives disagree in size, so it is checked before them).
    const Tensor sizes =
        from_vector<int64_t>({channels, input.numel() / std::max<int64_t>(channels, 1)}).to(input.device());
    Tensor gathered = empty({comm_->size(), 2}, TensorOptions(kInt64).device(input.device()));
    comm_->all_gather_into_tensor(gathered, sizes);
    const std::vector<int64_t> per_rank = gathered.to_vector<int64_t>();
    int64_t values = 0;
    std::vector<int64_t> channels_of;
    for (int r = 0; r < comm_->size(); ++r) {
      channels_of.push_back(per_rank[2 * r]);
      values += per_rank[2 * r + 1];
    }
    KILN_CHECK(std::all_of(channels_of.begin(), channels_of.end(), [&](int64_t c) { return c == channels; }),
               "{}: the ranks' inputs have {} channels (dim 1, ranks 0, 1, ...); every rank's must have the same", op,
               fmt::join(channels_of, ", "));
    KILN_CHECK(values > 1, "{}: expected more than 1 value per channel when training, got {} over all ranks", op,
               values);

    // 16-bit inputs are normalised in float32, as batch_norm's statistics.
    const bool low = input.dtype() == kFloat16 || input.dtype() == kBFloat16;
    const Tensor x = low ? input.to(kFloat32) : input;
    std::vector<int64_t> reduced = {0};
    for (int64_t d = 2; d < dims; ++d) reduced.push_back(d);
    const Shape over(reduced);
    const double count = static_cast<double>(values);
    const Tensor mean = AllReduceSum::apply(x.sum(over), comm_.get()) / count;  // (C)
    const Tensor centered = x - per_channel(mean, dims);
    const Tensor var = AllReduceSum::apply(centered.square().sum(over), comm_.get()) / count;  // biased
    Tensor y = centered * per_channel((var + eps).rsqrt(), dims);
    if (weight.defined()) y = y * per_channel(weight.to(y.dtype()), dims);
    if (bias.defined()) y = y + per_channel(bias.to(y.dtype()), dims);
    if (running_mean.defined()) {
      NoGradGuard no_grad;
      Tensor rm = running_mean, rv = running_var;  // the layer's buffers, updated in place
      rm.mul_(1 - momentum).add_(mean.detach().to(rm.dtype()), momentum);
      rv.mul_(1 - momentum).add_((var.detach() * (count / (count - 1))).to(rv.dtype()), momentum);
    }
    return low ? y.to(input.dtype()) : y;
  }

 private:
  std::shared_ptr<Communicator> comm_;
};

void check_comm(const std::shared_ptr<Communicator>& comm, const char* who) {
  KILN_CHECK(comm != nullptr, "{}: the communicator is null; pass the one distributed::init() returned", who);
}

}  // namespace

int convert_sync_batchnorm(nn::Module& module, std::shared_ptr<Communicator> comm) {
  check_comm(comm, "convert_sync_batchnorm");
  auto stats = std::make_shared<CollectiveStats>(comm);
  int converted = 0;
  for (auto& [name, m] : module.named_modules()) {
    if (auto* bn = dynamic_cast<nn::BatchNormBase*>(m)) {
      bn->sync = stats;
      ++converted;
    }
  }
  return converted;
}

SyncBatchNorm::SyncBatchNorm(int64_t num_features, std::shared_ptr<Communicator> comm, nn::BatchNormOptions options)
    : nn::BatchNormBase(num_features, options) {
  check_comm(comm, "distributed::SyncBatchNorm");
  sync = std::make_shared<CollectiveStats>(std::move(comm));
}

void SyncBatchNorm::check_input(const Tensor& input) const {
  KILN_CHECK(input.dim() >= 2, "distributed::SyncBatchNorm: expected an input of at least 2 dims (N, C, *), got {}D",
             input.dim());
}

}  // namespace kiln::distributed
