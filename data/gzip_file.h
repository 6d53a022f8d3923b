// data/gzip_file.h: reads a whole file into memory, inflating it through zlib when it is gzip'd
// (by its magic bytes 1f 8b, whatever its name), and opens regular files only. Used by the IDX,
// byte-text and safetensors readers; internal to data/, not in the umbrella header.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

// The file's bytes, or its inflated bytes when it is gzip'd (several members are concatenated, as
// gunzip does). A missing file, a read error, a truncated or corrupt stream: an Error naming
// `path`.
std::vector<uint8_t> read_file_maybe_gzip(const std::string& path);

// `path` opened to read ("rb"), for the caller to fclose, once it is known to be a regular file: a
// FIFO, a directory or a device is an Error, "<prefix>'<path>' is not a regular file; <hint>",
// and opening a FIFO does not wait for a writer on the way. An Error also when it cannot be opened.
std::FILE* open_regular_file(const std::string& path, std::string_view prefix, std::string_view hint);

}  // namespace kiln::data
