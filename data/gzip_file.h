// data/gzip_file.h: reads a whole file into memory, inflating it through zlib when it is gzip'd
// (by its magic bytes 1f 8b, whatever its name). Used by the IDX and byte-text readers; internal to
// data/, not in the umbrella header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::data {

// The file's bytes, or its inflated bytes when it is gzip'd (several members are concatenated, as
// gunzip does). A missing file, a read error, a truncated or corrupt stream: an Error naming
// `path`.
std::vector<uint8_t> read_file_maybe_gzip(const std::string& path);

}  // namespace kiln::data
