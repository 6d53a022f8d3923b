// nn/packed_sequence.cpp: see nn/packed_sequence.h. The sequences' steps are gathered (index_select) and
// scattered back (index_add) by row lists built on the host from the lengths, so packing and padding are
// differentiable on any device.
#include "nn/packed_sequence.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "ops/ops.h"

namespace kiln::nn::utils::rnn {

namespace {

// How many of the sequences (lengths in batch order) have a step t, for each t below the longest.
std::vector<int64_t> batch_sizes_of(const std::vector<int64_t>& lengths) {
  const int64_t longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  std::vector<int64_t> sizes(static_cast<size_t>(longest), 0);
  for (int64_t length : lengths) {
    for (int64_t t = 0; t < length; ++t) ++sizes[static_cast<size_t>(t)];
  }
  return sizes;
}

// The rows of the time-major padded (steps * batch, *) tensor that a packed sequence holds, in its order:
// step t of the i-th longest sequence is row t * batch + order[i].
std::vector<int64_t> packed_rows(const std::vector<int64_t>& batch_sizes, const std::vector<int64_t>& order) {
  std::vector<int64_t> rows;
  const int64_t batch = static_cast<int64_t>(order.size());
  for (size_t t = 0; t < batch_sizes.size(); ++t) {
    for (int64_t i = 0; i < batch_sizes[t]; ++i) rows.push_back(static_cast<int64_t>(t) * batch + order[i]);
  }
  return rows;
}

// (steps, batch, *) -> (steps * batch, *).
Tensor step_rows(const Tensor& padded) {
  Shape rows = padded.sizes();
  rows.erase(0);
  rows[0] = padded.size(0) * padded.size(1);
  return padded.reshape(rows);
}

// The sequence's batch order (sorted_indices, or 0, 1, ... for a sorted batch) after checking its parts.
std::vector<int64_t> checked_order(const PackedSequence& sequence, const std::vector<int64_t>& batch_sizes,
                                   const char* op) {
  KILN_CHECK(sequence.data.defined() && sequence.data.dim() >= 1, "{}: the PackedSequence has no data", op);
  int64_t total = 0;
  for (size_t t = 0; t < batch_sizes.size(); ++t) {
    KILN_CHECK(batch_sizes[t] >= 1 && (t == 0 || batch_sizes[t] <= batch_sizes[t - 1]),
               "{}: batch_sizes must be positive and not increase, got {} at step {}", op, batch_sizes[t], t);
    total += batch_sizes[t];
  }
  KILN_CHECK(total == sequence.data.size(0), "{}: batch_sizes sum to {} steps but data has {} rows", op, total,
             sequence.data.size(0));
  const int64_t batch = batch_sizes.empty() ? 0 : batch_sizes[0];
  std::vector<int64_t> order(static_cast<size_t>(batch));
  std::iota(order.begin(), order.end(), 0);
  if (sequence.sorted_indices.defined()) {
    order = sequence.sorted_indices.to_vector<int64_t>();
    std::vector<int64_t> seen = order;
    std::sort(seen.begin(), seen.end());
    bool permutation = static_cast<int64_t>(seen.size()) == batch;
    for (int64_t i = 0; permutation && i < batch; ++i) permutation = seen[static_cast<size_t>(i)] == i;
    KILN_CHECK(permutation, "{}: sorted_indices must be a permutation of the batch's {} sequences", op, batch);
  }
  return order;
}

PackedSequence pack_in_order(const Tensor& padded, const std::vector<int64_t>& lengths,
                             const std::vector<int64_t>& order, bool keep_order) {
  const std::vector<int64_t> batch_sizes = batch_sizes_of(lengths);
  const std::vector<int64_t> rows = packed_rows(batch_sizes, order);
  const Device device = padded.device();
  PackedSequence packed;
  packed.data = step_rows(padded).index_select(0, from_vector(rows, {static_cast<int64_t>(rows.size())}, device));
  packed.batch_sizes = from_vector(batch_sizes);
  if (keep_order) {
    std::vector<int64_t> inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
    packed.sorted_indices = from_vector(order, {static_cast<int64_t>(order.size())}, device);
    packed.unsorted_indices = from_vector(inverse, {static_cast<int64_t>(inverse.size())}, device);
  }
  return packed;
}

}  // namespace

PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths, bool batch_first,
                                    bool enforce_sorted) {
  const char* op = "pack_padded_sequence";
  KILN_CHECK(input.defined() && input.dim() >= 2, "{}: input must be padded sequences ({}, *), got {}", op,
             batch_first ? "B, L" : "L, B", input.defined() ? input.sizes().str() : std::string("none"));
  KILN_CHECK(lengths.defined() && lengths.dim() == 1 && (lengths.dtype() == kInt64 || lengths.dtype() == kInt32),
             "{}: lengths must be a 1-D int64 or int32 tensor, one length per sequence", op);
  const Tensor x = batch_first ? input.transpose(0, 1) : input;  // (L, B, *)
  const int64_t steps = x.size(0), batch = x.size(1);
  const std::vector<int64_t> length = lengths.to_vector<int64_t>();
  KILN_CHECK(batch >= 1 && static_cast<int64_t>(length.size()) == batch,
             "{}: lengths has {} entries for a batch of {} sequences (at least one)", op, length.size(), batch);
  for (int64_t b = 0; b < batch; ++b) {
    KILN_CHECK(length[b] >= 1 && length[b] <= steps,
               "{}: lengths[{}] is {}; each must be in [1, {}] (a sequence of no steps cannot be packed)", op, b,
               length[b], steps);
    KILN_CHECK(!enforce_sorted || b == 0 || length[b] <= length[b - 1],
               "{}: with enforce_sorted the lengths must not increase, but lengths[{}] = {} > lengths[{}] = {}; "
               "sort the batch by length or pass enforce_sorted = false",
               op, b, length[b], b - 1, length[b - 1]);
  }
  std::vector<int64_t> order(static_cast<size_t>(batch));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return length[a] > length[b]; });
  return pack_in_order(x, length, order, !enforce_sorted);
}

std::tuple<Tensor, Tensor> pad_packed_sequence(const PackedSequence& sequence, bool batch_first,
                                               double padding_value, std::optional<int64_t> total_length) {
  const char* op = "pad_packed_sequence";
  KILN_CHECK(sequence.batch_sizes.defined() && sequence.batch_sizes.dim() == 1,
             "{}: the PackedSequence has no batch_sizes", op);
  const std::vector<int64_t> batch_sizes = sequence.batch_sizes.to_vector<int64_t>();
  const std::vector<int64_t> order = checked_order(sequence, batch_sizes, op);
  const int64_t longest = static_cast<int64_t>(batch_sizes.size()), batch = static_cast<int64_t>(order.size());
  const int64_t steps = total_length.value_or(longest);
  KILN_CHECK(steps >= longest, "{}: total_length {} is below the longest sequence's {} steps", op, steps, longest);
  std::vector<int64_t> lengths(static_cast<size_t>(batch), 0);
  for (int64_t t = 0; t < longest; ++t) {
    for (int64_t i = 0; i < batch_sizes[t]; ++i) ++lengths[static_cast<size_t>(order[i])];
  }
  const Tensor& data = sequence.data;
  const std::vector<int64_t> rows = packed_rows(batch_sizes, order);
  Shape flat = data.sizes();
  flat[0] = steps * batch;
  const Tensor at = from_vector(rows, {static_cast<int64_t>(rows.size())}, data.device());
  Tensor padded = index_add(zeros(flat, data.options()), 0, at, data);
  if (padding_value != 0) {
    Shape mask_shape = Shape::filled(flat.size(), 1);
    mask_shape[0] = flat[0];
    const Tensor filled = index_add(zeros({flat[0]}, TensorOptions(kInt64).device(data.device())), 0, at,
                                    ones({at.numel()}, TensorOptions(kInt64).device(data.device())))
                              .gt(0)
                              .view(mask_shape);
    padded = where(filled, padded, padding_value);
  }
  Shape out = data.sizes();
  out[0] = batch;
  out.insert(0, steps);
  padded = padded.view(out);
  return {batch_first ? padded.transpose(0, 1) : padded, from_vector(lengths)};
}

Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first, double padding_value) {
  const char* op = "pad_sequence";
  KILN_CHECK(!sequences.empty(), "{}: needs at least one sequence", op);
  const Tensor& first = sequences[0];
  KILN_CHECK(first.defined() && first.dim() >= 1, "{}: each sequence must be (L, *), got {}", op,
             first.defined() ? first.sizes().str() : std::string("none"));
  Shape trailing = first.sizes();
  trailing.erase(0);
  int64_t longest = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const Tensor& s = sequences[i];
    KILN_CHECK(s.defined() && s.dim() == first.dim() && s.dtype() == first.dtype() && s.device() == first.device(),
               "{}: sequence {} must be (L, *) of sequence 0's rank, dtype and device ({}-D {} on {})", op, i,
               first.dim(), dtype_name(first.dtype()), first.device().str());
    Shape rest = s.sizes();
    rest.erase(0);
    KILN_CHECK(rest == trailing, "{}: sequence {} has trailing shape {}, sequence 0 {}", op, i, rest.str(),
               trailing.str());
    longest = std::max(longest, s.size(0));
  }
  std::vector<Tensor> padded;
  for (const Tensor& s : sequences) {
    if (s.size(0) == longest) {
      padded.push_back(s);
      continue;
    }
    Shape fill = s.sizes();
    fill[0] = longest - s.size(0);
    padded.push_back(cat({s, full(fill, padding_value, s.options())}, 0));
  }
  return stack(padded, batch_first ? 0 : 1);
}

PackedSequence pack_sequence(const std::vector<Tensor>& sequences, bool enforce_sorted) {
  std::vector<int64_t> lengths;
  for (const Tensor& s : sequences) lengths.push_back(s.defined() && s.dim() >= 1 ? s.size(0) : 0);
  return pack_padded_sequence(pad_sequence(sequences), from_vector(lengths), false, enforce_sorted);
}

PackedSequence pack_like(const Tensor& padded, const PackedSequence& like) {
  const std::vector<int64_t> batch_sizes = like.batch_sizes.to_vector<int64_t>();
  const std::vector<int64_t> order = checked_order(like, batch_sizes, "pack_like");
  std::vector<int64_t> lengths(order.size(), 0);
  for (size_t t = 0; t < batch_sizes.size(); ++t) {
    for (int64_t i = 0; i < batch_sizes[t]; ++i) ++lengths[static_cast<size_t>(order[i])];
  }
  PackedSequence packed = pack_in_order(padded, lengths, order, false);
  packed.sorted_indices = like.sorted_indices;
  packed.unsorted_indices = like.unsorted_indices;
  return packed;
}

}  // namespace kiln::nn::utils::rnn
