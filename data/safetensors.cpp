// data/safetensors.cpp: the safetensors writer (atomic) and the validating reader. Format and
// rules: data/safetensors.h. The spec: github.com/huggingface/safetensors, its README and
// safetensors/src/tensor.rs (the writer's order, the reader's checks).
#include "data/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "data/gzip_file.h"
#include "ops/ops.h"

namespace kiln::safetensors {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; Kiln writes host bytes as they are");

using Json = nlohmann::ordered_json;
constexpr uint64_t kMaxHeader = 100'000'000;  // the reference reader's limit
// A header nests 3 deep at most (object, tensor entry, shape); deeper JSON is refused while parsing,
// before anything recurses over it (quoting a value in a message dumps it recursively).
constexpr int kMaxHeaderDepth = 8;

// Kiln's dtypes by their safetensors names; `align` orders the writer's data section (larger
// first).
struct DTypeName {
  DType dtype;
  std::string_view name;
  int align;
};
constexpr DTypeName kDTypes[] = {
    {kInt64, "I64", 6},     {kFloat64, "F64", 5}, {kFloat32, "F32", 4}, {kInt32, "I32", 3},
    {kBFloat16, "BF16", 2}, {kFloat16, "F16", 1}, {kUInt8, "U8", 0},    {kInt8, "I8", 0},
    {kBool, "BOOL", 0},
};
// Names the format knows that Kiln has no tensor type for.
constexpr std::string_view kForeignDTypes[] = {"U16",     "I16",     "U32",     "U64",     "F8_E5M2",
                                               "F8_E4M3", "F8_E8M0", "F4",      "F6_E2M3", "F6_E3M2",
                                               "C64"};
constexpr std::string_view kKilnDTypes = "F64, F32, F16, BF16, I64, I32, I8, U8, BOOL";

const DTypeName& name_of(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d;
  }
  KILN_FAIL("safetensors: no name for dtype {}", dtype_name(dtype));
}

// ---------------------------------------------------------------------------------------------
// Writing

// The file a save replaces: `path`, or where `path` leads when it is a symbolic link, so that the
// link stays and its target gets the new data (as open(path, O_WRONLY) writes through a link).
std::string write_target(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = path;
  for (int hops = 0; hops < 40 && fs::is_symlink(p, ec); ++hops) {  // 40: Linux's limit (ELOOP)
    const fs::path link = fs::read_symlink(p, ec);
    if (ec) break;
    p = link.is_absolute() ? link : p.parent_path() / link;
  }
  return p.string();
}

// A file created next to the target and renamed over it by commit(); removed if never committed.
// It takes the permissions of the file it replaces.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path), target_(write_target(path)) {
    static std::atomic<uint64_t> counter{0};
    for (int attempt = 0; fd_ < 0; ++attempt) {
      tmp_ = fmt::format("{}.tmp.{}.{}", target_, ::getpid(), counter++);
      fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      KILN_CHECK(fd_ >= 0 || (errno == EEXIST && attempt < 100),
                 "safetensors: cannot write '{}': creating the temporary file '{}' failed: {}",
                 path, tmp_, std::strerror(errno));
    }
    struct stat old {};
    if (::stat(target_.c_str(), &old) == 0) ::fchmod(fd_, old.st_mode & 07777);
  }
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  void write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      KILN_CHECK(w > 0, "safetensors: writing '{}' failed after {} bytes: {}; '{}' is unchanged",
                 tmp_, written_, std::strerror(w < 0 ? errno : EIO), path_);
      p += w;
      n -= static_cast<size_t>(w);
      written_ += static_cast<uint64_t>(w);
    }
  }

  void commit() {
    KILN_CHECK(::fsync(fd_) == 0, "safetensors: fsync of '{}' failed: {}; '{}' is unchanged", tmp_,
               std::strerror(errno), path_);
    const int rc = ::close(fd_);
    fd_ = -1;
    KILN_CHECK(rc == 0, "safetensors: closing '{}' failed: {}; '{}' is unchanged", tmp_,
               std::strerror(errno), path_);
    KILN_CHECK(::rename(tmp_.c_str(), target_.c_str()) == 0,
               "safetensors: renaming '{}' to '{}' failed: {}; '{}' is unchanged", tmp_, path_,
               std::strerror(errno), path_);
    committed_ = true;
    // The rename is durable once the directory is on disk too.
    const std::string parent = std::filesystem::path(target_).parent_path().string();
    const char* dir = parent.empty() ? "." : parent.c_str();
    const int dfd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    KILN_CHECK(dfd >= 0 && ::fsync(dfd) == 0,
               "safetensors: wrote '{}' but fsync of its directory "
               "'{}' failed: {}",
               path_, dir, std::strerror(errno));
    ::close(dfd);
  }

 private:
  std::string path_, target_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
  bool committed_ = false;
};

}  // namespace

void save_file(const TensorDict& tensors, const std::string& path, const Metadata& metadata) {
  KILN_CHECK(!path.empty(), "safetensors: the path to save to is empty; name a file");
  struct Entry {
    const std::string* name;
    const Tensor* tensor;
    const DTypeName* dtype;
  };
  std::vector<Entry> entries;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(t.defined(), "safetensors::save_file '{}': tensor '{}' is undefined", path, name);
    KILN_CHECK(name != "__metadata__",
               "safetensors::save_file '{}': '__metadata__' is reserved and cannot name a tensor",
               path);
    entries.push_back({&name, &t, &name_of(t.dtype())});
  }
  // The reference writer's order: larger alignment first, then by name (bytewise).
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    if (a.dtype->align != b.dtype->align) return a.dtype->align > b.dtype->align;
    return *a.name < *b.name;
  });

  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;  // std::map: sorted keys
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    Json shape = Json::array();
    for (int64_t d : e.tensor->sizes()) shape.push_back(d);
    const uint64_t n = static_cast<uint64_t>(e.tensor->nbytes());
    Json info = Json::object();
    info["dtype"] = e.dtype->name;
    info["shape"] = std::move(shape);
    info["data_offsets"] = Json::array({offset, offset + n});
    header[*e.name] = std::move(info);
    offset += n;
  }
  std::string json;
  try {
    json = header.dump(-1, ' ', false, Json::error_handler_t::strict);
  } catch (const Json::exception& ex) {
    KILN_FAIL("safetensors::save_file '{}': names and metadata must be valid UTF-8 ({})", path,
              ex.what());
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t header_len = json.size();

  AtomicFile file(path);
  file.write(&header_len, 8);
  file.write(json.data(), json.size());
  for (const Entry& e : entries) {
    // One tensor on the host at a time, so saving from a GPU needs little host memory.
    Tensor host = e.tensor->detach().cpu().contiguous();
    file.write(host.data_ptr(), static_cast<size_t>(host.nbytes()));
  }
  file.commit();
}

// ---------------------------------------------------------------------------------------------
// Reading

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // in the data section
};

struct Header {
  Metadata metadata;
  std::vector<Entry> entries;  // in the header's order
  uint64_t data_start = 0;     // 8 + N
};

// A JSON value quoted in an Error, cut to its first 200 characters.
std::string quote(const Json& value) {
  std::string s = value.dump();
  if (s.size() > 200) s = s.substr(0, 200) + fmt::format("... ({} characters)", s.size());
  return s;
}

// Parses and validates everything but the tensors' bytes.
Header read_header(std::FILE* f, const std::string& path) {
  auto fail = [&](const std::string& rule) { KILN_FAIL("safetensors '{}': {}", path, rule); };
  KILN_CHECK(std::fseek(f, 0, SEEK_END) == 0, "safetensors '{}': cannot seek: {}", path,
             std::strerror(errno));
  const uint64_t file_size = static_cast<uint64_t>(std::ftell(f));
  std::fseek(f, 0, SEEK_SET);
  if (file_size < 8) {
    fail(fmt::format("the file is {} bytes, shorter than the 8-byte header length", file_size));
  }
  uint64_t n = 0;
  if (std::fread(&n, 1, 8, f) != 8) fail("read error in the header length");
  if (n > kMaxHeader) {
    fail(
        fmt::format("header length {} exceeds the limit of {} bytes; this is not a safetensors "
                    "file, or it is damaged",
                    n, kMaxHeader));
  }
  if (n > file_size - 8) {
    fail(
        fmt::format("header length {} runs past the end of the file ({} bytes); the file is "
                    "truncated",
                    n, file_size));
  }
  std::string text(n, '\0');
  if (std::fread(text.data(), 1, n, f) != n) fail("read error in the header");

  // Parse, refusing duplicate names (the JSON object's last value would silently win) and nesting
  // deeper than the format has.
  std::set<std::string> names;
  std::string duplicate;
  Json json;
  try {
    json = Json::parse(text, [&](int depth, Json::parse_event_t event, Json& parsed) {
      if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
          depth >= kMaxHeaderDepth) {
        fail(fmt::format("the header nests JSON more than {} levels deep; a safetensors header has 3",
                         kMaxHeaderDepth));
      }
      if (event == Json::parse_event_t::key && depth == 1 &&
          !names.insert(parsed.get<std::string>()).second) {
        duplicate = parsed.get<std::string>();
      }
      return true;
    });
  } catch (const Json::exception& ex) {
    fail(fmt::format("the header is not valid UTF-8 JSON: {}", ex.what()));
  }
  if (!duplicate.empty()) fail(fmt::format("the header names '{}' twice", duplicate));
  if (!json.is_object()) fail("the header is not a JSON object");

  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = file_size - h.data_start;
  for (const auto& [name, value] : json.items()) {
    if (name == "__metadata__") {
      bool ok = value.is_object();
      if (ok) {
        for (const auto& [k, v] : value.items()) {
          if (!v.is_string())
            ok = false;
          else
            h.metadata[k] = v.get<std::string>();
        }
      }
      if (!ok) fail("__metadata__ must be an object whose values are strings");
      continue;
    }
    const std::string where = fmt::format("tensor '{}'", name);
    if (!value.is_object() || value.size() != 3 || !value.contains("dtype") ||
        !value.contains("shape") || !value.contains("data_offsets")) {
      fail(
          fmt::format("{} must be an object with exactly the keys dtype, shape and data_offsets, "
                      "got {}",
                      where, quote(value)));
    }
    Entry e;
    e.name = name;
    const Json& dtype = value["dtype"];
    if (!dtype.is_string()) fail(fmt::format("{}: dtype must be a string", where));
    const std::string dname = dtype.get<std::string>();
    const DTypeName* known = nullptr;
    for (const auto& d : kDTypes) {
      if (d.name == dname) known = &d;
    }
    if (known == nullptr) {
      if (std::find(std::begin(kForeignDTypes), std::end(kForeignDTypes), dname) !=
          std::end(kForeignDTypes)) {
        fail(fmt::format("{}: dtype {} is valid safetensors but Kiln has no such dtype (it has {})",
                         where, dname, kKilnDTypes));
      }
      fail(fmt::format("{}: unknown dtype '{}' (Kiln reads {})", where, dname, kKilnDTypes));
    }
    e.dtype = known->dtype;
    const Json& shape = value["shape"];
    if (!shape.is_array())
      fail(fmt::format("{}: shape must be a list of non-negative integers", where));
    if (shape.size() > static_cast<size_t>(kMaxDims)) {
      fail(fmt::format("{}: shape has {} dims; Kiln tensors have at most {}", where, shape.size(),
                       kMaxDims));
    }
    uint64_t numel = 1;
    bool overflow = false;
    for (const Json& d : shape) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX}) {
        fail(fmt::format("{}: shape {} must be a list of non-negative integers", where,
                         quote(shape)));
      }
      e.shape.push_back(d.get<int64_t>());
      overflow |= __builtin_mul_overflow(numel, d.get<uint64_t>(), &numel);
    }
    const Json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      fail(fmt::format("{}: data_offsets {} must be two non-negative integers [begin, end]", where,
                       quote(offsets)));
    }
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end) {
      fail(fmt::format("{}: data_offsets [{}, {}] have begin > end", where, e.begin, e.end));
    }
    if (e.end > data_size) {
      fail(
          fmt::format("{}: data_offsets [{}, {}] lie outside the data section of {} bytes; the "
                      "file is truncated or the header is wrong",
                      where, e.begin, e.end, data_size));
    }
    uint64_t bytes = 0;
    overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(itemsize(e.dtype)), &bytes);
    if (overflow || bytes != e.end - e.begin) {
      fail(fmt::format("{}: dtype {} x shape {} is {} bytes but data_offsets [{}, {}] span {}",
                       where, dname, e.shape.str(), overflow ? "too many" : std::to_string(bytes),
                       e.begin, e.end, e.end - e.begin));
    }
    h.entries.push_back(std::move(e));
  }

  // The entries must tile the data section: sorted by offsets, each begins where the last ended.
  std::vector<const Entry*> sorted;
  for (const Entry& e : h.entries) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : sorted) {
    if (e->begin < cursor) {
      fail(fmt::format(
          "tensor '{}' at data_offsets [{}, {}] overlaps tensor '{}' (which ends at {})", e->name,
          e->begin, e->end, previous->name, cursor));
    }
    if (e->begin > cursor) {
      fail(fmt::format("hole in the data section: bytes [{}, {}) belong to no tensor (next: '{}')",
                       cursor, e->begin, e->name));
    }
    cursor = e->end;
    previous = e;
  }
  if (cursor != data_size) {
    fail(
        fmt::format("trailing bytes: the tensors cover {} bytes but the data section has {} (file "
                    "length {}, expected {})",
                    cursor, data_size, file_size, h.data_start + cursor));
  }
  return h;
}

std::unique_ptr<std::FILE, FileCloser> open_for_reading(const std::string& path) {
  return std::unique_ptr<std::FILE, FileCloser>(
      data::open_regular_file(path, "safetensors: ", "give the path of a .safetensors file"));
}

}  // namespace

TensorDict load_file(const std::string& path, Device device) {
  auto f = open_for_reading(path);
  const Header h = read_header(f.get(), path);
  TensorDict out;
  for (const Entry& e : h.entries) {
    Tensor t = empty(e.shape, e.dtype);
    const size_t n = static_cast<size_t>(e.end - e.begin);
    if (n > 0) {
      KILN_CHECK(std::fseek(f.get(), static_cast<long>(h.data_start + e.begin), SEEK_SET) == 0 &&
                     std::fread(t.data_ptr(), 1, n, f.get()) == n,
                 "safetensors '{}': read error in tensor '{}'", path, e.name);
    }
    if (e.dtype == kBool) {
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      for (size_t i = 0; i < n; ++i) {
        KILN_CHECK(p[i] <= 1,
                   "safetensors '{}': tensor '{}' (BOOL) holds byte {} at element {}; "
                   "booleans must be 0 or 1",
                   path, e.name, p[i], i);
      }
    }
    out.insert(e.name, device.is_cpu() ? t : t.to(device));
  }
  return out;
}

Metadata load_metadata(const std::string& path) {
  auto f = open_for_reading(path);
  return read_header(f.get(), path).metadata;
}

}  // namespace kiln::safetensors
