// data/safetensors.h: tensors in files, in Hugging Face's safetensors format (readable by the
// Python `safetensors` package and by PyTorch through it). See DESIGN.md §7.
//
// A file: 8 bytes N (little-endian uint64), N bytes of JSON, then the data section. The JSON object
// maps each tensor's name to {"dtype":"F32","shape":[2,3],"data_offsets":[begin,end]} (offsets into
// the data section) and may hold "__metadata__": string -> string. Kiln writes what the reference
// writer (the Rust crate behind the Python package) writes, byte for byte: tensors ordered by dtype
// alignment, largest first (I64, F64, F32, I32, BF16, F16, BOOL), then by name; compact JSON with
// "__metadata__" first (its keys sorted: the reference writer's order is a hash map's); the header
// padded with spaces to a multiple of 8 bytes.
//
// Writes are atomic: a temporary file in the same directory, fsync, rename over the target, fsync
// of the directory; on failure the target is untouched. The new file keeps the old one's permissions,
// and a path that is a symbolic link keeps its link: the file it points to is the one replaced.
// Reads enforce every rule of the format and report a violation as an Error naming the file and the
// rule (including a header that nests JSON deeper than the format does).
#pragma once

#include <map>
#include <string>

#include "core/tensor_dict.h"

namespace kiln::safetensors {

using Metadata = std::map<std::string, std::string>;

// Saves `tensors` (any device; copied to the host) to `path`. Metadata, when not empty, goes into
// "__metadata__".
void save_file(const TensorDict& tensors, const std::string& path, const Metadata& metadata = {});
// Loads every tensor of `path`, in the header's order, onto `device`.
TensorDict load_file(const std::string& path, Device device = Device::cpu());
// The "__metadata__" of `path` (empty when it has none); the whole header is validated.
Metadata load_metadata(const std::string& path);

}  // namespace kiln::safetensors
