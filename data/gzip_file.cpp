// data/gzip_file.cpp: read_file_maybe_gzip, streaming the file through zlib's inflate in chunks so
// that only the inflated bytes are held in memory.
#include "data/gzip_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/error.h"

namespace kiln::data {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// gzip's trailer ends with the inflated length mod 2^32 (ISIZE): a good first guess for the buffer.
// A damaged trailer must not make us allocate gigabytes, so the guess is capped by deflate's
// largest ratio (1032:1).
size_t isize_hint(std::FILE* f) {
  unsigned char tail[4];
  size_t hint = 0, compressed = 0;
  if (std::fseek(f, -4, SEEK_END) == 0 && std::fread(tail, 1, 4, f) == 4) {
    hint = tail[0] | (tail[1] << 8) | (tail[2] << 16) | (static_cast<size_t>(tail[3]) << 24);
    compressed = static_cast<size_t>(std::ftell(f));
  }
  std::fseek(f, 0, SEEK_SET);
  return std::min(hint, compressed * 1032);
}

std::vector<uint8_t> inflate_file(std::FILE* f, const std::string& path) {
  z_stream zs{};
  KILN_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "'{}': zlib inflateInit2 failed", path);
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, inflateEnd);

  // One byte more than the hint, so that a correct hint never makes the buffer grow.
  std::vector<uint8_t> out(std::max<size_t>(isize_hint(f) + 1, 1 << 16));
  std::vector<uint8_t> in(1 << 18);
  size_t produced = 0, consumed = 0;
  bool member_done = false;  // the last inflate ended a gzip member
  for (;;) {
    if (zs.avail_in == 0) {
      const size_t got = std::fread(in.data(), 1, in.size(), f);
      KILN_CHECK(!std::ferror(f), "'{}': read error after {} bytes: {}", path, consumed,
                 std::strerror(errno));
      if (got == 0) break;
      consumed += got;
      zs.next_in = in.data();
      zs.avail_in = static_cast<uInt>(got);
    }
    if (member_done) {  // more bytes after a member: the next member
      inflateReset(&zs);
      member_done = false;
    }
    if (produced == out.size()) out.resize(out.size() + out.size() / 2);
    zs.next_out = out.data() + produced;
    zs.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - produced, UINT32_MAX));
    const uInt before = zs.avail_out;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    produced += before - zs.avail_out;
    if (rc == Z_STREAM_END) {
      member_done = true;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      KILN_FAIL(
          "'{}': corrupt gzip data near compressed byte {} ({}); the file is damaged, fetch it "
          "again",
          path, consumed - zs.avail_in, zs.msg ? zs.msg : "zlib error");
    }
  }
  KILN_CHECK(
      member_done,
      "'{}': truncated gzip stream (it ends after {} compressed bytes, {} inflated, before the "
      "end of its data); the file is incomplete, fetch it again",
      path, consumed, produced);
  out.resize(produced);
  if (out.capacity() - produced > produced / 4) out.shrink_to_fit();  // a copy: only when it pays
  return out;
}

}  // namespace

std::FILE* open_regular_file(const std::string& path, std::string_view prefix, std::string_view hint) {
  // O_NONBLOCK: a FIFO opened to read would otherwise wait here for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  KILN_CHECK(fd >= 0, "{}cannot open '{}': {}", prefix, path, std::strerror(errno));
  struct stat st {};
  std::FILE* f = nullptr;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::fcntl(fd, F_SETFL, O_RDONLY) == 0) f = ::fdopen(fd, "rb");
  if (f == nullptr) {
    ::close(fd);
    KILN_FAIL("{}'{}' is not a regular file; {}", prefix, path, hint);
  }
  return f;
}

std::vector<uint8_t> read_file_maybe_gzip(const std::string& path) {
  File f(open_regular_file(path, "", "give the path of a file"));
  unsigned char magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, f.get());
  if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    std::fseek(f.get(), 0, SEEK_SET);
    return inflate_file(f.get(), path);
  }
  std::fseek(f.get(), 0, SEEK_END);
  const long size = std::ftell(f.get());
  KILN_CHECK(size >= 0, "'{}': cannot tell its size: {}", path, std::strerror(errno));
  std::fseek(f.get(), 0, SEEK_SET);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  KILN_CHECK(std::fread(bytes.data(), 1, bytes.size(), f.get()) == bytes.size(),
             "'{}': read error: {}", path, std::strerror(errno));
  return bytes;
}

}  // namespace kiln::data
