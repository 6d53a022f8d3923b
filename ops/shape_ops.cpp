// ops/shape_ops.cpp: ops that rearrange whole tensors: cat, stack, split, chunk, flip, repeat, pad
// (every mode), pixel_shuffle, tril and triu. Most are views plus copies; the split family returns views.

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ops/autocast.h"
#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops/record.h"

namespace kiln {

using autograd::Grads;
using autograd::record;
using autograd::record_no_tensors;
using autograd::should_record;
using autograd::TensorList;

namespace {
void raw_copy_into(const Tensor& src, const Tensor& dst) {
  backend_for(dst.device()).copy(broadcast_view(src, dst.sizes()), src.device(), view_of(dst), dst.device(),
                                 stream_for(dst.device()));
}
}  // namespace

inline namespace ops {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  if (autocast::is_enabled(tensors[0].device().type)) {  // See Note [autocast] in ops/autocast.h
    if (autocast::OpScope ac{autocast::Op::Cat, tensors[0].device(), tensors}) return cat(ac.cast(tensors), dim);
  }
  // As PyTorch, 1-D tensors of size 0 are skipped whatever the others' shapes.
  std::vector<Tensor> parts;
  for (const auto& t : tensors)
    if (!(t.dim() == 1 && t.numel() == 0)) parts.push_back(t);
  if (parts.empty()) return tensors[0].clone();
  const Tensor& first = parts[0];
  KILN_CHECK(first.dim() > 0, "cat: zero-dimensional tensors cannot be concatenated; unsqueeze them first");
  int d = wrap_dim(dim, first.dim(), "cat");
  DType dt = first.dtype();
  Shape shape = first.sizes();
  shape[d] = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor& t = parts[i];
    check_same_device("cat", first, t);
    KILN_CHECK(t.dim() == first.dim(), "cat: tensor {} has {} dims but tensor 0 has {}", i, t.dim(), first.dim());
    for (int k = 0; k < t.dim(); ++k) {
      KILN_CHECK(k == d || t.sizes()[k] == first.sizes()[k],
                 "cat: sizes must match except in dim {}; tensor 0 has shape {} and tensor {} has shape {}", d,
                 first.sizes().str(), i, t.sizes().str());
    }
    KILN_CHECK(!__builtin_add_overflow(shape[d], t.sizes()[d], &shape[d]),
               "cat: the sizes in dim {} add up past 2^63 (tensor {} has shape {})", d, i, t.sizes().str());
    dt = promote_types(dt, t.dtype());
  }
  for (const auto& t : tensors) dt = promote_types(dt, t.dtype());  // the skipped ones' too, as PyTorch
  Tensor out = empty_tensor(shape, dt, first.device());
  std::vector<int64_t> offsets, sizes;
  int64_t offset = 0;
  for (const auto& t : parts) {
    raw_copy_into(t, out.detach().narrow(d, offset, t.sizes()[d]));
    offsets.push_back(offset);
    sizes.push_back(t.sizes()[d]);
    offset += t.sizes()[d];
  }
  if (should_record(tensors)) {
    // Every input gets its gradient, a skipped 1-D empty one an empty gradient, as PyTorch's.
    std::vector<DType> dtypes;
    std::vector<int64_t> input_offsets, input_sizes;  // offset -1: skipped
    size_t part = 0;
    for (const auto& t : tensors) {
      dtypes.push_back(t.dtype());
      const bool skipped = t.dim() == 1 && t.numel() == 0;
      input_offsets.push_back(skipped ? -1 : offsets[part]);
      input_sizes.push_back(skipped ? 0 : sizes[part]);
      if (!skipped) ++part;
    }
    record_no_tensors("CatBackward", tensors, {out},
                      [d, input_offsets, input_sizes, dtypes](const Grads& g) -> TensorList {
                        TensorList grads;
                        for (size_t i = 0; i < input_offsets.size(); ++i) {
                          if (!g.needs_grad(i)) {
                            grads.push_back(Tensor());
                          } else if (input_offsets[i] < 0) {
                            grads.push_back(zeros({0}, g[0].options().dtype(dtypes[i])));
                          } else {
                            grads.push_back(g[0].narrow(d, input_offsets[i], input_sizes[i]).to(dtypes[i]));
                          }
                        }
                        return grads;
                      });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  KILN_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  if (autocast::is_enabled(tensors[0].device().type)) {
    if (autocast::OpScope ac{autocast::Op::Stack, tensors[0].device(), tensors}) return stack(ac.cast(tensors), dim);
  }
  int d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  for (size_t i = 0; i < tensors.size(); ++i) {
    KILN_CHECK(tensors[i].sizes() == tensors[0].sizes(),
               "stack: expects tensors of one shape, got {} at 0 and {} at {}", tensors[0].sizes().str(),
               tensors[i].sizes().str(), i);
    parts.push_back(tensors[i].unsqueeze(d));
  }
  return cat(parts, d);
}

std::vector<Tensor> split_with_sizes(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  KILN_CHECK(x.dim() > 0, "split: expects a tensor of at least 1 dimension, got a 0-dimensional one");
  int d = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0 && s <= x.sizes()[d], "split: each size must be in [0, {}] (the size of dim {}), got {}",
               x.sizes()[d], d, s);
    KILN_CHECK(!__builtin_add_overflow(total, s, &total), "split: the sizes add up to more than 2^63 but dim {} has "
               "size {}", d, x.sizes()[d]);
  }
  KILN_CHECK(total == x.sizes()[d], "split: the sizes add up to {} but dim {} has size {}", total, d, x.sizes()[d]);
  // One node for all the pieces, as PyTorch's SplitBackward: their gradients are joined by one cat,
  // where a SliceBackward per piece would write each into zeros of x's shape for autograd to add up
  // (for GPT's q | k | v: three zero fills, three copies and two additions of the whole (B, T, 3 C)).
  const bool grad = should_record(x);
  std::vector<Tensor> out;
  {
    NoGradGuard no_grad;
    int64_t offset = 0;
    for (int64_t s : sizes) {
      out.push_back(x.narrow(d, offset, s));
      offset += s;
    }
  }
  // Made without recording, the pieces are still views of x as narrow() makes them with grad mode on.
  if (GradMode::is_enabled()) {
    for (const Tensor& piece : out) autograd::detail::mark_view(*piece.impl(), x);
  }
  if (grad) {
    const Shape shape = x.sizes();
    record_no_tensors("SplitBackward", {x}, out, [shape, d, sizes](const Grads& g) -> TensorList {
      TensorOptions options;
      for (const Tensor& gi : g.grads)
        if (gi.defined()) options = gi.options();
      std::vector<Tensor> pieces;
      for (size_t i = 0; i < sizes.size(); ++i) {
        Shape piece = shape;
        piece[d] = sizes[i];
        pieces.push_back(g[i].defined() ? g[i] : zeros(piece, options));
      }
      return {cat(pieces, d)};
    });
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  KILN_CHECK(x.dim() > 0, "split: expects a tensor of at least 1 dimension, got a 0-dimensional one");
  int d = wrap_dim(dim, x.dim(), "split");
  // As PyTorch: a split_size of 0 only for a dim of size 0 (one empty piece).
  KILN_CHECK(split_size > 0 || (split_size == 0 && x.sizes()[d] == 0),
             "split: split_size must be positive (0 only for a dim of size 0), got {} for dim {} of size {}",
             split_size, d, x.sizes()[d]);
  // At most 2^31 pieces (a split of a dim of 2^62 into pairs would build its list until memory ran out).
  const int64_t n = x.sizes()[d];
  KILN_CHECK(split_size == 0 || (n - 1) / split_size < (int64_t{1} << 31),
             "split: a dim of size {} in pieces of {} makes more pieces than the 2^31 a list can return", n, split_size);
  std::vector<int64_t> sizes;
  for (int64_t left = n; left > 0; left -= split_size) sizes.push_back(std::min(left, split_size));
  if (sizes.empty()) sizes.push_back(0);
  return split_with_sizes(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  KILN_CHECK(chunks > 0, "chunk: chunks must be positive, got {}", chunks);
  KILN_CHECK(x.dim() > 0, "chunk: expects a tensor of at least 1 dimension, got a 0-dimensional one");
  int d = wrap_dim(dim, x.dim(), "chunk");
  int64_t n = x.sizes()[d];
  // A dim of size 0 gives `chunks` empty pieces, as PyTorch; otherwise pieces of ceil(n / chunks).
  if (n == 0) {
    KILN_CHECK(chunks <= (int64_t{1} << 24), "chunk: {} empty pieces of a dim of size 0 are too many to return",
               chunks);
    return split_with_sizes(x, std::vector<int64_t>(static_cast<size_t>(chunks), 0), d);
  }
  return split(x, (n - 1) / chunks + 1, d);  // ceil(n / chunks), without n + chunks overflowing
}

Tensor flip(const Tensor& x, const Shape& dims) {
  View src = view_of(x);
  bool seen[kMaxDims] = {};
  for (int64_t dim : dims) {
    int d = wrap_dim(dim, x.dim(), "flip");
    KILN_CHECK(!seen[d], "flip: dim {} appears more than once in {}", d, dims.str());
    seen[d] = true;
    if (x.numel() == 0) continue;  // nothing to walk (the offset below could pass 2^63 in bytes)
    // Start at the last element along d and walk backwards: a negative stride, which kernels accept.
    src.data = static_cast<char*>(src.data) + (x.sizes()[d] - 1) * x.strides()[d] * x.element_size();
    src.strides[d] = -src.strides[d];
  }
  Tensor out = empty_tensor(x.sizes(), x.dtype(), x.device());
  backend_for(x.device()).copy(src, x.device(), view_of(out), x.device(), stream_for(x.device()));
  if (should_record(x)) {
    record("FlipBackward", {x}, {out}, [dims](const Grads& g) -> TensorList { return {g[0].flip(dims)}; });
  }
  return out;
}

Tensor repeat(const Tensor& x, const Shape& repeats) {
  KILN_CHECK(repeats.size() >= x.dim(),
             "repeat: needs at least as many repeats ({}) as the tensor has dims ({})", repeats.size(), x.dim());
  for (int64_t r : repeats) KILN_CHECK(r >= 0, "repeat: repeats must be non-negative, got {}", repeats.str());
  const int n = repeats.size();
  KILN_CHECK(2 * n <= kMaxDims, "repeat: at most {} repeat dims are supported", kMaxDims / 2);
  Shape padded = Shape::filled(n - x.dim(), 1);
  for (int64_t s : x.sizes()) padded.push_back(s);
  // (s0, s1) -> (1, s0, 1, s1) -> expand (r0, s0, r1, s1) -> (r0*s0, r1*s1): autograd through views.
  Shape interleaved, expanded, result;
  for (int i = 0; i < n; ++i) {
    interleaved.push_back(1), interleaved.push_back(padded[i]);
    expanded.push_back(repeats[i]), expanded.push_back(padded[i]);
    int64_t size = 0;
    KILN_CHECK(!__builtin_mul_overflow(repeats[i], padded[i], &size),
               "repeat: {} repeats of a dim of size {} make a size past 2^63", repeats[i], padded[i]);
    result.push_back(size);
  }
  return x.reshape(interleaved).expand(expanded).contiguous().view(result);
}

Tensor pad(const Tensor& x, const std::vector<int64_t>& padding, double value) {
  KILN_CHECK(padding.size() % 2 == 0 && static_cast<int>(padding.size()) / 2 <= x.dim(),
             "pad: expects (left, right) pairs for at most {} dims, got {} values", x.dim(), padding.size());
  Shape shape = x.sizes();
  Tensor src = x.detach();
  std::vector<std::tuple<int, int64_t, int64_t>> windows;  // dim, start in out, length
  for (size_t i = 0; i < padding.size() / 2; ++i) {
    int d = x.dim() - 1 - static_cast<int>(i);
    const int64_t lo = padding[2 * i], hi = padding[2 * i + 1];
    // In 128 bits: the sums, and the negations below and in the backward, of any int64 paddings.
    using Wide = __int128;
    KILN_CHECK(lo != INT64_MIN && hi != INT64_MIN, "pad: a padding of -2^63 has no negation in int64 (the "
               "gradient's padding); got ({}, {}) for dim {}", lo, hi, d);
    const Wide size = Wide{x.sizes()[d]} + lo + hi;
    KILN_CHECK(size >= 0, "pad: padding ({}, {}) makes dim {} of size {} negative", lo, hi, d, x.sizes()[d]);
    KILN_CHECK(size <= INT64_MAX, "pad: padding ({}, {}) makes dim {} of size {} longer than 2^63", lo, hi, d,
               x.sizes()[d]);
    shape[d] = static_cast<int64_t>(size);
    // Negative padding crops the input.
    const int64_t crop_lo = std::max<int64_t>(0, -lo), crop_hi = std::max<int64_t>(0, -hi);
    const int64_t len = static_cast<int64_t>(std::max<Wide>(0, Wide{x.sizes()[d]} - crop_lo - crop_hi));
    src = src.narrow(d, std::min(crop_lo, x.sizes()[d]), len);
    windows.emplace_back(d, std::max<int64_t>(0, lo), len);
  }
  Tensor out = full(shape, value, x.options());
  Tensor window = out.detach();
  for (auto [d, start, len] : windows) window = window.narrow(d, start, len);
  raw_copy_into(src, window);
  if (should_record(x)) {
    std::vector<int64_t> negated;
    for (int64_t p : padding) negated.push_back(-p);
    record_no_tensors("PadBackward", {x}, {out}, [negated](const Grads& g) -> TensorList { return {pad(g[0], negated, 0)}; });
  }
  return out;
}

// The modes other than "constant" gather: along each padded dim, output position o reads the input
// position that reflecting or clamping o - left into [0, size) gives (circular: wrapping o - left
// around what the crops leave); index_select does the gather and its backward (an index_add) the
// gradient.
Tensor pad(const Tensor& x, const std::vector<int64_t>& padding, std::string_view mode, double value) {
  if (mode == "constant") return pad(x, padding, value);
  const bool reflect = mode == "reflect", replicate = mode == "replicate", circular = mode == "circular";
  KILN_CHECK(reflect || replicate || circular,
             "pad: mode must be \"constant\", \"reflect\", \"replicate\" or \"circular\", got \"{}\"", mode);
  KILN_CHECK(value == 0, "pad: mode \"{}\" takes no value (got {}); only \"constant\" pads with a value", mode,
             value);
  const int n = static_cast<int>(padding.size()) / 2;
  KILN_CHECK(padding.size() % 2 == 0 && n >= 1 && n <= 3,
             "pad: mode \"{}\" pads 1, 2 or 3 trailing dims, as (left, right) pairs; got {} values", mode,
             padding.size());
  KILN_CHECK(x.dim() == n + 1 || x.dim() == n + 2,
             "pad: mode \"{}\" with {} (left, right) pairs takes a {}-D or {}-D input (unbatched or batched), "
             "got shape {}", mode, n, n + 1, n + 2, x.sizes().str());
  Tensor out = x;
  for (int i = 0; i < n; ++i) {
    const int d = x.dim() - 1 - i;
    const int64_t size = x.sizes()[d], lo = padding[2 * i], hi = padding[2 * i + 1];
    if (reflect) {
      KILN_CHECK(lo < size && hi < size, "pad: reflect's padding ({}, {}) of dim {} must be below its size {} "
                 "(the reflection does not repeat the edge)", lo, hi, d, size);
    } else if (replicate) {
      KILN_CHECK(size > 0 || (lo <= 0 && hi <= 0), "pad: replicate cannot pad dim {} of size 0", d);
    }
    const __int128 wide = static_cast<__int128>(size) + lo + hi;  // no int64 overflow for any pads
    KILN_CHECK(wide >= 0 && wide <= INT64_MAX, "pad: padding ({}, {}) makes dim {} of size {} {}", lo, hi, d, size,
               wide < 0 ? "negative" : "longer than 2^63");
    const auto length = static_cast<int64_t>(wide);
    // circular crops first and wraps around what is left, as PyTorch's (reflect and replicate read the
    // uncropped input, so a crop on one side does not change the other side's pad).
    const int64_t crop_lo = std::max<int64_t>(0, -lo), inner = size - crop_lo - std::max<int64_t>(0, -hi);
    const int64_t pad_lo = std::max<int64_t>(0, lo);
    if (circular) {
      KILN_CHECK(pad_lo <= inner && hi <= inner, "pad: circular's padding ({}, {}) of dim {} must be at most the "
                 "size left after cropping, {} (it wraps around once)", lo, hi, d, inner);
    }
    if (lo == 0 && hi == 0) continue;
    Tensor positions = empty(Shape{length}, kInt64);  // from the allocator: too long is an Error, as for x
    int64_t* index = positions.data_ptr<int64_t>();
    for (int64_t o = 0; o < length; ++o) {
      int64_t c = o - lo;
      if (reflect) {
        c = c < 0 ? -c : c >= size ? 2 * (size - 1) - c : c;
      } else if (replicate) {
        c = std::clamp<int64_t>(c, 0, size - 1);
      } else {
        c = crop_lo + ((o - pad_lo) % inner + inner) % inner;
      }
      index[o] = c;
    }
    out = index_select(out, d, positions.to(x.device()));
  }
  return out;
}

Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor) {
  const int64_t r = upscale_factor;
  KILN_CHECK(r > 0, "pixel_shuffle: upscale_factor must be positive, got {}", r);
  KILN_CHECK(x.dim() >= 3, "pixel_shuffle: expects an input (*, C r^2, H, W), got shape {}", x.sizes().str());
  const int k = x.dim();
  const int64_t c = x.sizes()[k - 3], h = x.sizes()[k - 2], w = x.sizes()[k - 1];
  KILN_CHECK(c % (r * r) == 0, "pixel_shuffle: the channels ({}) must be divisible by upscale_factor^2 ({})", c, r * r);
  Shape lead;
  for (int i = 0; i < k - 3; ++i) lead.push_back(x.sizes()[i]);
  // (*, C, r, r, H, W) -> (*, C, H, r, W, r) -> (*, C, H r, W r)
  Shape split = lead, perm, merged = lead;
  for (int64_t s : {c / (r * r), r, r, h, w}) split.push_back(s);
  for (int i = 0; i < k - 3; ++i) perm.push_back(i);
  for (int i : {0, 3, 1, 4, 2}) perm.push_back(k - 3 + i);
  for (int64_t s : {c / (r * r), h * r, w * r}) merged.push_back(s);
  return x.reshape(split).permute(perm).reshape(merged);
}

Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor) {
  const int64_t r = downscale_factor;
  KILN_CHECK(r > 0, "pixel_unshuffle: downscale_factor must be positive, got {}", r);
  KILN_CHECK(x.dim() >= 3, "pixel_unshuffle: expects an input (*, C, H r, W r), got shape {}", x.sizes().str());
  const int k = x.dim();
  const int64_t c = x.sizes()[k - 3], h = x.sizes()[k - 2], w = x.sizes()[k - 1];
  KILN_CHECK(h % r == 0 && w % r == 0, "pixel_unshuffle: height {} and width {} must be divisible by "
             "downscale_factor {}", h, w, r);
  Shape lead;
  for (int i = 0; i < k - 3; ++i) lead.push_back(x.sizes()[i]);
  // (*, C, H, r, W, r) -> (*, C, r, r, H, W) -> (*, C r^2, H, W)
  Shape split = lead, perm, merged = lead;
  for (int64_t s : {c, h / r, r, w / r, r}) split.push_back(s);
  for (int i = 0; i < k - 3; ++i) perm.push_back(i);
  for (int i : {0, 2, 4, 1, 3}) perm.push_back(k - 3 + i);
  for (int64_t s : {c * r * r, h / r, w / r}) merged.push_back(s);
  return x.reshape(split).permute(perm).reshape(merged);
}

static Tensor triangle(const Tensor& x, int64_t diagonal, bool upper) {
  const char* name = upper ? "triu" : "tril";
  KILN_CHECK(x.dim() >= 2, "{}: needs at least 2 dims, got shape {}", name, x.sizes().str());
  int64_t rows = x.sizes()[x.dim() - 2], cols = x.sizes()[x.dim() - 1];
  Tensor r = arange(rows, kInt64, x.device()).unsqueeze(1);
  Tensor c = arange(cols, kInt64, x.device()).unsqueeze(0);
  Tensor offset = c - r;  // column minus row: 0 on the diagonal
  Tensor keep = upper ? offset.ge(diagonal) : offset.le(diagonal);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = where(keep, x, zeros({}, x.options()));
  }
  if (should_record(x)) {  // the gradient is masked the same way; nothing saved, as PyTorch's
    record(upper ? "TriuBackward" : "TrilBackward", {x}, {out}, [diagonal, upper](const Grads& g) -> TensorList {
      return {triangle(g[0], diagonal, upper)};
    });
  }
  return out;
}
Tensor tril(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, false); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle(x, diagonal, true); }

}  // namespace ops
}  // namespace kiln
