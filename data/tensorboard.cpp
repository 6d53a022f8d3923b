// data/tensorboard.cpp: TensorBoard event files (see tensorboard.h).
#include "data/tensorboard.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "data/gzip_file.h"

namespace kiln::tensorboard {

namespace {

// The byte-at-a-time table of the reflected Castagnoli polynomial.
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protocol buffers' wire format, the three field kinds an Event needs: a field's key is
// (number << 3) | wire type, then a varint (type 0), 8 little-endian bytes (1), a varint length and
// the bytes (2), or 4 little-endian bytes (5).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
template <class T>
void put_le(std::string& out, T v) {  // the host is little-endian (x86-64, AArch64 Linux)
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}
void put_key(std::string& out, int field, int wire_type) { put_varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event fields: 1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary (Summary).
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, 1);
  put_le(e, wall_time);
  if (step != 0) {  // proto3 leaves zeros out
    put_key(e, 2, 0);
    put_varint(e, static_cast<uint64_t>(step));  // a negative step takes ten bytes, as int64 does
  }
  return e;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::atomic<int> g_files{0};  // the file counter in the name, as PyTorch's global uid

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto& table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Whether `s` is well-formed UTF-8: no stray continuation byte, overlong form, surrogate or code
// point past U+10FFFF. A Summary.Value's tag is a protobuf string, which TensorBoard's parser
// rejects otherwise.
bool valid_utf8(std::string_view s) {
  static constexpr uint32_t kSmallest[] = {0, 0x80, 0x800, 0x10000};  // by count of continuation bytes
  for (size_t i = 0; i < s.size();) {
    const auto lead = static_cast<unsigned char>(s[i]);
    size_t extra = 0;
    uint32_t cp = lead;
    if (lead >= 0x80) {
      if ((lead & 0xE0) == 0xC0) {
        extra = 1;
      } else if ((lead & 0xF0) == 0xE0) {
        extra = 2;
      } else if ((lead & 0xF8) == 0xF0) {
        extra = 3;
      } else {
        return false;
      }
      cp = lead & (0x3F >> extra);  // the lead byte's payload bits
      if (s.size() - i <= extra) return false;
      for (size_t k = 1; k <= extra; ++k) {
        const auto b = static_cast<unsigned char>(s[i + k]);
        if ((b & 0xC0) != 0x80) return false;
        cp = cp << 6 | (b & 0x3F);
      }
      if (cp < kSmallest[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    }
    i += extra + 1;
  }
  return true;
}

std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;  // Summary.Value: 1 tag (string), 2 simple_value (float)
  put_bytes(v, 1, tag);
  put_key(v, 2, 5);
  put_le(v, value);
  std::string summary;  // Summary: 1 value (repeated Value)
  put_bytes(summary, 1, v);
  std::string e = event_head(wall_time, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}

std::string tf_record(std::string_view payload) {
  std::string r;
  put_le(r, static_cast<uint64_t>(payload.size()));
  put_le(r, masked_crc32c(r.data(), 8));
  r.append(payload);
  put_le(r, masked_crc32c(payload.data(), payload.size()));
  return r;
}

std::vector<std::string> read_tf_records(const std::string& path) {
  // A regular file only: a directory, a device (/dev/zero would never end) or a FIFO is an Error.
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(
      data::open_regular_file(path, "tensorboard::read_tf_records: ", "give the path of an event file"), &std::fclose);
  std::string bytes;
  char chunk[1 << 16];
  for (size_t got; (got = std::fread(chunk, 1, sizeof chunk, in.get())) > 0;) bytes.append(chunk, got);
  KILN_CHECK(!std::ferror(in.get()), "tensorboard::read_tf_records: reading '{}' failed", path);
  auto le = [&](size_t at, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
    return v;
  };
  std::vector<std::string> payloads;
  for (size_t at = 0; at + 12 <= bytes.size();) {
    KILN_CHECK(le(at + 8, 4) == masked_crc32c(bytes.data() + at, 8),
               "tensorboard::read_tf_records: '{}': the length of record {} (at byte {}) fails its CRC; the file is "
               "corrupt from there on", path, payloads.size(), at);
    const uint64_t n = le(at, 8);
    if (n > bytes.size() - at - 12 || bytes.size() - at - 12 - n < 4) break;  // cut off: the end
    KILN_CHECK(le(at + 12 + n, 4) == masked_crc32c(bytes.data() + at + 12, n),
               "tensorboard::read_tf_records: '{}': the payload of record {} (at byte {}) fails its CRC; the file is "
               "corrupt there", path, payloads.size(), at);
    payloads.push_back(bytes.substr(at + 12, n));
    at += 12 + n + 4;
  }
  return payloads;
}

SummaryWriter::SummaryWriter(const std::string& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  KILN_CHECK(!ec && std::filesystem::is_directory(log_dir),
             "tensorboard::SummaryWriter: cannot create the directory '{}'{}; give a writable path", log_dir,
             ec ? ": " + ec.message() : "");
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  host[sizeof(host) - 1] = '\0';
  const double t = now_seconds();
  path_ = (std::filesystem::path(log_dir) /
           fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<int64_t>(t), host, getpid(), g_files++))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  KILN_CHECK(file_ != nullptr, "tensorboard::SummaryWriter: cannot create '{}': {}; give a writable log_dir", path_,
             std::strerror(errno));
  write(tf_record(file_version_event(t)));
  flush();
}

SummaryWriter::~SummaryWriter() {
  if (file_) std::fclose(file_);
}

void SummaryWriter::write(const std::string& record) {
  KILN_CHECK(file_ != nullptr, "tensorboard::SummaryWriter: '{}' is closed; make a new writer to add more", path_);
  const size_t written = std::fwrite(record.data(), 1, record.size(), file_);
  KILN_CHECK(written == record.size(), "tensorboard::SummaryWriter: writing '{}' failed: {}; check the disk", path_,
             std::strerror(errno));
}

void SummaryWriter::add_scalar(std::string_view tag, double value, int64_t step, double wall_time) {
  KILN_CHECK(!tag.empty(), "tensorboard::SummaryWriter.add_scalar: the tag is empty; name the scalar (\"Train/loss\")");
  KILN_CHECK(valid_utf8(tag), "tensorboard::SummaryWriter.add_scalar: the tag is not valid UTF-8, which TensorBoard "
             "cannot read; name the scalar in UTF-8");
  write(tf_record(scalar_event(wall_time < 0 ? now_seconds() : wall_time, step, tag, static_cast<float>(value))));
}

void SummaryWriter::flush() {
  if (file_ == nullptr) return;
  KILN_CHECK(std::fflush(file_) == 0, "tensorboard::SummaryWriter: writing '{}' failed: {}; check the disk", path_,
             std::strerror(errno));
}

void SummaryWriter::close() {
  if (file_ == nullptr) return;
  flush();
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace kiln::tensorboard
