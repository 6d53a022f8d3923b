// data/byte_text.h: ByteText, a byte-level text corpus (vocabulary: the 256 byte values) for
// character language models, sampled in random windows as BENCHMARKS.md e does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/generator.h"
#include "data/dataset.h"

namespace kiln::data {

class ByteText {
 public:
  explicit ByteText(const std::string& path);  // the file's bytes (inflated when gzip'd)
  explicit ByteText(std::vector<uint8_t> bytes, std::string name = "<memory>");

  // BENCHMARKS.md's corpus, built from Debian's `fortunes` package (1:1.99.1-7.3) and base-files:
  // the regular files (not the symbolic links) directly in /usr/share/games/fortunes not named
  // *.dat, then those directly in /usr/share/common-licenses, each list sorted bytewise by path,
  // concatenated: 2,813,994 bytes (scripts/make_fortunes_corpus.sh writes the same bytes to a file).
  // An Error when the folders are missing or the size differs (another package version).
  static ByteText fortunes();
  static constexpr int64_t kFortunesSize = 2813994;

  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

  // `batch` offsets o uniform in [0, N - T - 1) drawn from `gen` (T = context); data x =
  // bytes[o : o + T], target y = bytes[o + 1 : o + T + 1], both int64 (batch, T).
  Example sample(int64_t batch, int64_t context, Generator& gen) const;

 private:
  std::vector<uint8_t> bytes_;
  std::string name_;
};

}  // namespace kiln::data
