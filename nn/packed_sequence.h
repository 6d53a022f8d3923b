// nn/packed_sequence.h: batches of sequences of different lengths for the recurrent layers, as
// torch.nn.utils.rnn: PackedSequence and pack_padded_sequence, pad_packed_sequence, pad_sequence,
// pack_sequence. RNN, LSTM and GRU take a PackedSequence through forward_with_packed_input (nn/rnn.h):
// each sequence is then run for its own length only, so h_n is its state at its last step and the
// reverse direction starts there.
//
//   auto packed = nn::utils::rnn::pack_padded_sequence(x, lengths, /*batch_first=*/true, /*enforce_sorted=*/false);
//   auto [out, state] = lstm.forward_with_packed_input(packed);
//   auto [padded, out_lengths] = nn::utils::rnn::pad_packed_sequence(out, /*batch_first=*/true);
#pragma once

#include <optional>
#include <tuple>
#include <vector>

#include "core/tensor.h"

namespace kiln::nn::utils::rnn {

// The steps of a batch of sequences, step by step: data holds step 0 of every sequence, then step 1 of
// every sequence at least 2 long, and so on, the sequences in decreasing order of length (ties in their
// batch order; PyTorch's sort is not stable, so in a large batch its data and sorted_indices may order
// ties otherwise, while the padded sequences and the layers' results agree). batch_sizes[t] is how many sequences have a step t. sorted_indices lists the batch's
// sequences in that order (sorted_indices[i] is the batch position of the i-th longest) and
// unsorted_indices is its inverse; both undefined when the batch came sorted (enforce_sorted).
struct PackedSequence {
  Tensor data;              // (sum of the lengths, *)
  Tensor batch_sizes;       // (longest length), int64 on the CPU
  Tensor sorted_indices;    // (batch), int64 on data's device, or undefined
  Tensor unsorted_indices;  // (batch), int64 on data's device, or undefined
};

// input (L, B, *) padded ((B, L, *) with batch_first) and each sequence's length (1-D, int64 or int32,
// read on the host; each in [1, L]). enforce_sorted: the lengths must not increase (an Error otherwise);
// else the sequences are ordered here, and the order kept in sorted_indices.
PackedSequence pack_padded_sequence(const Tensor& input, const Tensor& lengths, bool batch_first = false,
                                    bool enforce_sorted = true);
// The inverse: (padded (L, B, *) or (B, L, *), lengths (B) int64 on the CPU), the sequences in their batch
// order, padding_value after each one's end. total_length, when given, pads to that many steps (at
// least the longest).
std::tuple<Tensor, Tensor> pad_packed_sequence(const PackedSequence& sequence, bool batch_first = false,
                                               double padding_value = 0.0,
                                               std::optional<int64_t> total_length = std::nullopt);
// Sequences (L_i, *) of one trailing shape, dtype and device -> (max L, B, *) ((B, max L, *) with
// batch_first), padding_value after each one's end.
Tensor pad_sequence(const std::vector<Tensor>& sequences, bool batch_first = false, double padding_value = 0.0);
// pad_sequence, then pack_padded_sequence with the sequences' lengths.
PackedSequence pack_sequence(const std::vector<Tensor>& sequences, bool enforce_sorted = true);
// padded (L, B, *) sequences of `like`'s lengths, packed in `like`'s order (its batch_sizes and indices):
// how the recurrent layers pack their output for a packed input.
PackedSequence pack_like(const Tensor& padded, const PackedSequence& like);

}  // namespace kiln::nn::utils::rnn
