// data/byte_text.cpp: ByteText.
#include "data/byte_text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "data/gzip_file.h"
#include "ops/ops.h"

namespace kiln::data {

ByteText::ByteText(const std::string& path) : ByteText(read_file_maybe_gzip(path), path) {}

ByteText::ByteText(std::vector<uint8_t> bytes, std::string name)
    : bytes_(std::move(bytes)), name_(std::move(name)) {}

ByteText ByteText::fortunes() {
  namespace fs = std::filesystem;
  const char* hint = "install Debian's fortunes package (apt-get install fortunes), or pass another text file";
  std::vector<uint8_t> bytes;
  for (const char* dir : {"/usr/share/games/fortunes", "/usr/share/common-licenses"}) {
    std::error_code ec;
    KILN_CHECK(fs::is_directory(dir, ec), "ByteText::fortunes: {} is missing; {}", dir, hint);
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string path = entry.path().string();
      if (entry.is_symlink() || !entry.is_regular_file() || path.ends_with(".dat")) continue;
      files.push_back(path);
    }
    std::sort(files.begin(), files.end());  // bytewise: the C locale's order
    for (const auto& path : files) {
      std::ifstream in(path, std::ios::binary);
      KILN_CHECK(in.good(), "ByteText::fortunes: cannot read {}", path);
      bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  KILN_CHECK(static_cast<int64_t>(bytes.size()) == kFortunesSize,
             "ByteText::fortunes: the corpus has {} bytes, not the {} of BENCHMARKS.md (fortunes 1:1.99.1-7.3); {}",
             bytes.size(), kFortunesSize, hint);
  return ByteText(std::move(bytes), "fortunes corpus");
}

Example ByteText::sample(int64_t batch, int64_t context, Generator& gen) const {
  KILN_CHECK(batch >= 1 && context >= 1,
             "ByteText::sample: batch ({}) and context ({}) must be at least 1", batch, context);
  const int64_t n = size();
  KILN_CHECK(n >= context + 2,
             "ByteText: '{}' has {} bytes, fewer than context + 2 = {}; use a longer text or a "
             "shorter context",
             name_, n, context + 2);
  const std::vector<int64_t> offsets =
      randint(0, n - context - 1, {batch}, kInt64, &gen).to_vector<int64_t>();
  Tensor x = empty({batch, context}, kInt64), y = empty({batch, context}, kInt64);
  int64_t* px = x.data_ptr<int64_t>();
  int64_t* py = y.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const uint8_t* src = bytes_.data() + offsets[b];
    for (int64_t t = 0; t < context; ++t) {
      px[b * context + t] = src[t];
      py[b * context + t] = src[t + 1];
    }
  }
  return {x, y};
}

}  // namespace kiln::data
