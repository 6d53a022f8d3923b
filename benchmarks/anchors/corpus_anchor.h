// corpus_anchor.h: the byte corpus of BENCHMARKS.md "e. gpt_char", read from a file or built in
// memory, for anchor_gpt_char.cpp. Siblings: scripts/make_fortunes_corpus.sh writes the same bytes
// to a file and checks their sha256 (its header documents the rule and why it is this one);
// torch_gpt_char.py builds them in Python. This project must not depend on Kiln, so Kiln's own
// reader is not used here.
//
// The rule: the regular files (not symbolic links: every NAME.u8 there links to NAME) directly in
// /usr/share/games/fortunes whose name does not end in ".dat", then the regular files directly in
// /usr/share/common-licenses, each list sorted by path bytewise (the C locale), concatenated.
// With Debian's fortunes 1:1.99.1-7.3 that is 2,813,994 bytes; the size is checked here, the
// sha256 by the script.

#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace corpus_anchor {

constexpr int64_t kSize = 2813994;
constexpr const char* kFortunes = "/usr/share/games/fortunes";
constexpr const char* kLicenses = "/usr/share/common-licenses";
constexpr const char* kHint =
    "install Debian's fortunes 1:1.99.1-7.3 (apt-get install fortunes), or pass --corpus PATH "
    "(scripts/make_fortunes_corpus.sh writes it)";

// Appends all of the file at path to *bytes; throws naming the file if it cannot.
inline void AppendFile(const std::string& path, std::vector<uint8_t>* bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  bytes->insert(bytes->end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("cannot read " + path);
}

// The regular files directly in dir (symbolic links left out), minus those ending in skip_suffix
// when it is not empty, sorted by path bytewise.
inline std::vector<std::string> SortedRegularFiles(const std::string& dir,
                                                   const std::string& skip_suffix) {
  namespace fs = std::filesystem;
  std::vector<std::string> paths;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file() || entry.is_symlink()) continue;
    std::string path = entry.path().string();
    bool skipped =
        !skip_suffix.empty() && path.size() >= skip_suffix.size() &&
        path.compare(path.size() - skip_suffix.size(), skip_suffix.size(), skip_suffix) == 0;
    if (!skipped) paths.push_back(path);
  }
  std::sort(paths.begin(), paths.end());  // std::string orders bytes as unsigned char: LC_ALL=C
  return paths;
}

// The corpus built in memory from the installed packages by the rule above.
inline std::vector<uint8_t> BuildFromPackages() {
  std::vector<uint8_t> bytes;
  bytes.reserve(kSize);
  for (const std::string& path : SortedRegularFiles(kFortunes, ".dat")) AppendFile(path, &bytes);
  for (const std::string& path : SortedRegularFiles(kLicenses, "")) AppendFile(path, &bytes);
  return bytes;
}

// The corpus from path, or built from the packages when path is empty. Throws, naming the fix, when
// it cannot be read or its size is not kSize.
inline std::vector<uint8_t> Load(const std::string& path) {
  std::vector<uint8_t> bytes;
  std::string from = path.empty() ? std::string(kFortunes) + " and " + kLicenses : path;
  try {
    if (path.empty()) {
      bytes = BuildFromPackages();
    } else {
      AppendFile(path, &bytes);
    }
  } catch (const std::exception& err) {
    throw std::runtime_error(std::string(err.what()) + "; " + kHint);
  }
  if (static_cast<int64_t>(bytes.size()) != kSize) {
    throw std::runtime_error("the corpus from " + from + " is " + std::to_string(bytes.size()) +
                             " bytes, not " + std::to_string(kSize) + "; " + kHint);
  }
  return bytes;
}

}  // namespace corpus_anchor
