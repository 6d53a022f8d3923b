// tests/data/test_safetensors.cpp: safetensors files: a fixture written by the Python package loads
// with the right values and Kiln's writer reproduces it byte for byte; round trips of every dtype;
// a table of bad files, each an Error naming the rule; atomic writes.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "data/files.h"
#include "support.h"

using namespace kiln;
using namespace kiln::test;
namespace st = kiln::safetensors;

namespace {

const std::string kFixture = std::string(KILN_TEST_FIXTURES) + "/safetensors_fixture.safetensors";

// The tensors of tests/fixtures/gen_safetensors_fixture.py, built in another order than its dict.
TensorDict fixture_tensors() {
  TensorDict d;
  d.insert("mask", tensor({1, 0, 0, 1, 1}).to(kBool));
  d.insert("half", tensor({1.0, -0.5, 65504.0}).to(kFloat16));
  d.insert("brain", tensor({1.5, -0x1p100}).to(kBFloat16));
  d.insert("index", from_vector<int32_t>({1, -2, 30000, INT32_MIN}, {2, 2}));
  d.insert("steps", from_vector<int64_t>({0, -1, int64_t{1} << 40, -(int64_t{1} << 62)}));
  d.insert("empty", zeros({0, 4}));
  d.insert("scalar", scalar_tensor(3.141592653589793, kFloat64));
  d.insert("layer.0.w", full({1, 1}, 7.0, kFloat64));
  d.insert("bias", tensor({0.1, 0.2, -0.3}));
  d.insert("weight", tensor({{0.5, -1.25, 2.0}, {3.0, -4.5, 1e-3}}));
  return d;
}
const st::Metadata kFixtureMetadata = {{"format", "pt"},
                                       {"note", "kiln fixture: \"quoted\" and \xc3\xa9"}};

// A file from a header text and a data section; `length` overrides the 8-byte header length.
Bytes make_file(const std::string& header, const Bytes& data, std::optional<uint64_t> length = {}) {
  const uint64_t n = length.value_or(header.size());
  Bytes out(8 + header.size() + data.size());
  std::memcpy(out.data(), &n, 8);  // little-endian, as the format and this host are
  std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

}  // namespace

TEST_CASE("safetensors: a file written by the Python package loads with its values",
          "[data][safetensors]") {
  TensorDict loaded = st::load_file(kFixture);
  // The header's order: the reference writer's (alignment, then name).
  CHECK(loaded.keys() == std::vector<std::string>{"steps", "layer.0.w", "scalar", "bias", "empty",
                                                  "weight", "index", "brain", "half", "mask"});
  TensorDict expected = fixture_tensors();
  for (const auto& [name, t] : expected) {
    CAPTURE(name);
    check_equal(loaded.at(name), t);
  }
  CHECK(loaded.at("scalar").dim() == 0);
  CHECK(loaded.at("empty").sizes() == Shape{0, 4});
  CHECK(loaded.at("steps").to_vector<int64_t>()[3] == -(int64_t{1} << 62));
  CHECK(loaded.at("half").to_vector<float>()[2] == 65504.0f);
  CHECK(loaded.at("brain").to_vector<double>()[1] == -0x1p100);
  CHECK(st::load_metadata(kFixture) == kFixtureMetadata);
}

TEST_CASE("safetensors: Kiln's writer reproduces the Python package's bytes",
          "[data][safetensors]") {
  TempDir dir;
  st::save_file(fixture_tensors(), dir / "kiln.safetensors", kFixtureMetadata);
  const Bytes ours = read_bytes(dir / "kiln.safetensors");
  const Bytes theirs = read_bytes(kFixture);
  REQUIRE(theirs.size() == 811);
  CHECK(ours.size() == theirs.size());
  CHECK(ours == theirs);
  uint64_t n = 0;
  std::memcpy(&n, ours.data(), 8);
  CHECK(n % 8 == 0);
  CHECK(ours[8 + n - 1] == ' ');  // padded with spaces
}

TEST_CASE("safetensors: every dtype round-trips, from any layout", "[data][safetensors]") {
  TempDir dir;
  TensorDict d;
  for (DType dtype : {kFloat64, kFloat32, kFloat16, kBFloat16, kInt64, kInt32, kInt8, kUInt8, kBool}) {
    Tensor t = dtype == kBool       ? sample({3, 4}).gt(0)
               : is_floating(dtype) ? sample({3, 4}, dtype)
                                    : (sample({3, 4}) * 1000).to(dtype);
    d.insert(std::string(dtype_name(dtype)), t);
    d.insert(std::string(dtype_name(dtype)) + ".t", t.t());  // non-contiguous
    d.insert(std::string(dtype_name(dtype)) + ".0d", t[1][2]);
  }
  d.insert("grad", randn({5}).requires_grad_());
  const std::string path = dir / "all.safetensors";
  st::save_file(d, path);
  TensorDict back = st::load_file(path);
  CHECK(back.size() == d.size());
  for (const auto& [name, t] : d) {
    CAPTURE(name);
    check_equal(back.at(name), t.detach());
    CHECK(!back.at(name).requires_grad());
  }
  CHECK(st::load_metadata(path).empty());
  // Saving again replaces the file.
  st::save_file({{"only", ones({2})}}, path, {{"k", "v"}});
  CHECK(st::load_file(path).keys() == std::vector<std::string>{"only"});
  CHECK(st::load_metadata(path) == st::Metadata{{"k", "v"}});
  // An empty dict is a valid file: "{}" padded to 8.
  st::save_file({}, dir / "empty.safetensors");
  CHECK(read_bytes(dir / "empty.safetensors") == make_file("{}      ", {}));
  CHECK(st::load_file(dir / "empty.safetensors").empty());
}

TEST_CASE("safetensors: U8 and I8 tensors load with their bytes' values and write back the same bytes",
          "[data][safetensors]") {
  TempDir dir;
  // As the reference writer lays a file out: the header padded with spaces to a multiple of 8, and
  // tensors of one alignment in name order.
  const std::string header =
      R"({"a":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2,2],"data_offsets":[4,8]}})";
  const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  const Bytes file = make_file(padded, {0x80, 0xff, 0x00, 0x7f, 0x00, 0x80, 0xff, 0x01});
  write_bytes(dir / "bytes.safetensors", file);
  TensorDict d = st::load_file(dir / "bytes.safetensors");
  CHECK(d.at("a").dtype() == kInt8);
  CHECK(d.at("a").to_vector<int64_t>() == std::vector<int64_t>{-128, -1, 0, 127});
  CHECK(d.at("b").dtype() == kUInt8);
  CHECK(d.at("b").sizes() == Shape{2, 2});
  CHECK(d.at("b").to_vector<int64_t>() == std::vector<int64_t>{0, 128, 255, 1});
  st::save_file(d, dir / "again.safetensors");
  CHECK(read_bytes(dir / "again.safetensors") == file);
}

TEST_CASE("safetensors: bad files are Errors that name the rule", "[data][safetensors]") {
  TempDir dir;
  const Bytes f32x2(8, 0);  // two float32 zeros
  const std::string a2 = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  Bytes good = make_file("{" + a2 + "}", f32x2);
  Bytes truncated(good.begin(), good.end() - 3);
  struct Case {
    const char* what;
    Bytes bytes;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"empty file", {}, {"the file is 0 bytes, shorter than the 8-byte header length"}},
      {"short length", {1, 0, 0}, {"the file is 3 bytes"}},
      {"oversized header",
       make_file("{}", {}, 100'000'001),
       {"header length 100000001 exceeds the limit"}},
      {"header past EOF",
       make_file("{}", {}, 1000),
       {"header length 1000 runs past the end of the file (10 bytes)"}},
      {"invalid JSON", make_file(R"({"a":{"dtype")", {}), {"not valid UTF-8 JSON"}},
      {"invalid UTF-8", make_file("{\"\xff\xfe\":1}", {}), {"not valid UTF-8 JSON"}},
      {"not an object", make_file("[1,2]", {}), {"not a JSON object"}},
      // Nesting 100000 deep overflowed the stack when the value was quoted in the message.
      {"deep nesting",
       make_file("{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", {}),
       {"nests JSON more than 8 levels deep"}},
      {"deep shape",
       make_file(R"({"a":{"dtype":"F32","shape":[[[[[[[[[2]]]]]]]]],"data_offsets":[0,8]}})", f32x2),
       {"nests JSON more than 8 levels deep"}},
      {"long value quoted in part",
       make_file(R"({"a":{"dtype":"F32","shape":[")" + std::string(5000, 'x') + R"("],"data_offsets":[0,8]}})",
                 f32x2),
       {"shape [\"xxxx", "... (5004 characters)"}},
      {"duplicate name", make_file("{" + a2 + "," + a2 + "}", Bytes(16, 0)), {"names 'a' twice"}},
      {"metadata not strings",
       make_file(R"({"__metadata__":{"k":1}})", {}),
       {"__metadata__ must be an object"}},
      {"entry not an object",
       make_file(R"({"a":[1]})", {}),
       {"tensor 'a' must be an object with exactly the keys"}},
      {"missing key",
       make_file(R"({"a":{"dtype":"F32","shape":[2]}})", f32x2),
       {"exactly the keys dtype, shape and data_offsets"}},
      {"extra key",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", f32x2),
       {"exactly the keys"}},
      {"unknown dtype",
       make_file(R"({"a":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}})", f32x2),
       {"tensor 'a'", "unknown dtype 'F17'"}},
      {"foreign dtype",
       make_file(R"({"a":{"dtype":"U16","shape":[4],"data_offsets":[0,8]}})", f32x2),
       {"dtype U16 is valid safetensors but Kiln has no such dtype"}},
      {"dtype not a string",
       make_file(R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", f32x2),
       {"dtype must be a string"}},
      {"negative shape",
       make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2),
       {"shape [-2] must be a list of non-negative integers"}},
      {"fractional shape",
       make_file(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", f32x2),
       {"non-negative integers"}},
      {"too many dims",
       make_file(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}})",
                 f32x2),
       {"9 dims", "at most 8"}},
      {"three offsets",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", f32x2),
       {"data_offsets [0,4,8] must be two non-negative integers"}},
      {"negative offset",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", f32x2),
       {"two non-negative integers"}},
      {"begin > end",
       make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f32x2),
       {"data_offsets [8, 0] have begin > end"}},
      {"offsets outside",
       make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32x2),
       {"data_offsets [0, 16] lie outside the data section of 8 bytes"}},
      {"truncated data", truncated, {"lie outside the data section of 5 bytes"}},
      {"wrong byte length",
       make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2),
       {"dtype F32 x shape [3] is 12 bytes but data_offsets [0, 8] span 8"}},
      {"numel overflow",
       make_file(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                 f32x2),
       {"is too many bytes"}},
      {"overlap",
       make_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           Bytes(12, 0)),
       {"tensor 'b' at data_offsets [4, 12] overlaps tensor 'a' (which ends at 8)"}},
      {"hole",
       make_file(
           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
           Bytes(12, 0)),
       {"hole in the data section: bytes [4, 8) belong to no tensor"}},
      {"leading hole",
       make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2),
       {"hole in the data section: bytes [0, 4)"}},
      {"trailing bytes",
       make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32x2),
       {"trailing bytes: the tensors cover 4 bytes but the data section has 8"}},
      {"bad boolean",
       make_file(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", {1, 2}),
       {"tensor 'm' (BOOL) holds byte 2 at element 1"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string path = dir / "bad.safetensors";
    write_bytes(path, c.bytes);
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back(path);
    check_error([&] { st::load_file(path); }, fragments);
  }
  check_error([&] { st::load_file(dir.path().string()); }, {"is not a regular file"});
  const std::string fifo = dir / "fifo.safetensors";  // an Error at once, not a wait for a writer
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  check_error([&] { st::load_file(fifo); }, {"safetensors: ", "is not a regular file", fifo});
  check_error([&] { st::load_file(dir / "absent.safetensors"); },
              {"cannot open", "absent.safetensors"});
  // A header that is valid on its own still has its file checked by load_metadata.
  write_bytes(dir / "trailing.safetensors", make_file("{}", {0}));
  check_error([&] { st::load_metadata(dir / "trailing.safetensors"); }, {"trailing bytes"});
  // The good file of the table loads (the table's cases differ from it by one thing each).
  write_bytes(dir / "good.safetensors", good);
  CHECK(st::load_file(dir / "good.safetensors").at("a").sizes() == Shape{2});
}

TEST_CASE("safetensors: what cannot be written is an Error before any file exists",
          "[data][safetensors]") {
  TempDir dir;
  const std::string path = dir / "x.safetensors";
  check_error(
      [&] {
        st::save_file({{"__metadata__", ones({1})}}, path);
      },
      {"'__metadata__' is reserved"});
  check_error([&] { st::save_file({{"bad", Tensor()}}, path); }, {"tensor 'bad' is undefined"});
  check_error([&] { st::save_file({{"\xff", ones({1})}}, path); }, {"valid UTF-8"});
  CHECK(std::filesystem::is_empty(dir.path()));
  // An empty path: said so, where a temporary file was written in the working directory and the
  // rename to '' failed.
  check_error([&] { st::save_file({{"w", ones({1})}}, ""); }, {"safetensors: the path to save to is empty"});
}

TEST_CASE("safetensors: a failed write leaves the old file and no temporary",
          "[data][safetensors]") {
  TempDir dir;
  // The parent is a regular file, so nothing can be created there (even as root).
  write_bytes(dir / "plain", {1, 2, 3});
  check_error(
      [&] {
        st::save_file({{"a", ones({2})}}, dir / "plain/x.safetensors");
      },
      {"cannot write", "plain/x.safetensors", "Not a directory"});

  // A write that fails midway (the file size limit, which binds root too): the target keeps its
  // old bytes and the temporary is gone.
  const std::string path = dir / "model.safetensors";
  st::save_file({{"old", full({4}, 1.5)}}, path);
  const Bytes old = read_bytes(path);
  rlimit saved{};
  getrlimit(RLIMIT_FSIZE, &saved);
  auto* previous = signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4096;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string message;
  try {
    st::save_file({{"new", zeros({100000})}}, path);
  } catch (const Error& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, previous);
  CHECK_THAT(message, Catch::Contains("writing") && Catch::Contains("is unchanged") &&
                          Catch::Contains("File too large"));
  CHECK(read_bytes(path) == old);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    files += entry.is_regular_file();
  CHECK(files == 2);  // "plain" and the model: no temporary left behind
  check_equal(st::load_file(path).at("old"), full({4}, 1.5));
}

TEST_CASE("safetensors: a save through a symbolic link replaces its target and keeps permissions",
          "[data][safetensors]") {
  TempDir dir;
  const std::string real = dir / "real.safetensors", link = dir / "latest.safetensors";
  st::save_file({{"old", ones({2})}}, real);
  std::filesystem::create_symlink("real.safetensors", link);  // relative, as `ln -s` makes them
  ::chmod(real.c_str(), 0600);
  st::save_file({{"new", full({3}, 2.5)}}, link);
  CHECK(std::filesystem::is_symlink(link));
  check_equal(st::load_file(real).at("new"), full({3}, 2.5));
  CHECK(!st::load_file(real).contains("old"));
  struct stat s {};
  REQUIRE(::stat(real.c_str(), &s) == 0);
  CHECK((s.st_mode & 07777) == 0600);
  // A link to a file not yet there creates it, as writing through the link would.
  std::filesystem::create_symlink(dir / "later.safetensors", dir / "dangling.safetensors");
  st::save_file({{"x", ones({1})}}, dir / "dangling.safetensors");
  CHECK(std::filesystem::is_symlink(dir / "dangling.safetensors"));
  check_equal(st::load_file(dir / "later.safetensors").at("x"), ones({1}));
}

TEST_CASE("safetensors: damaged copies of a good file load or raise an Error",
          "[data][safetensors]") {
  // Random bytes in the length and the header (the first 300 copies) or anywhere, some copies cut
  // short: the reader must never crash or hang (the sanitizer builds run this too).
  TempDir dir;
  const Bytes good = read_bytes(kFixture);
  const std::string path = dir / "damaged.safetensors";
  Generator gen(5);
  const auto noise = randint(0, 1 << 30, {1800}, kInt64, &gen).to_vector<int64_t>();
  int64_t loaded = 0, rejected = 0;
  for (size_t k = 0; k + 2 < noise.size(); k += 3) {
    Bytes bad = good;
    const size_t at = static_cast<size_t>(noise[k]) % (k < 900 ? 8 + 700 : bad.size());
    bad[at] = static_cast<uint8_t>(noise[k + 1]);
    if (noise[k + 2] % 4 == 0) bad.resize(static_cast<size_t>(noise[k + 2]) % bad.size());
    write_bytes(path, bad);
    try {
      st::load_file(path);
      ++loaded;
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains(path));
      ++rejected;
    }
  }
  CHECK(loaded + rejected == 600);
  CHECK(rejected > 200);
}
