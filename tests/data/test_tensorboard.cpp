// tests/data/test_tensorboard.cpp: TensorBoard event files: the CRC-32C and the Event encoding
// byte for byte against TensorBoard's own (tests/fixtures/gen_tensorboard_golden.py), and a
// SummaryWriter's file read back record by record.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/tensorboard.h"
#include "support.h"

using namespace kiln;
namespace tb = kiln::tensorboard;

namespace {

std::string hex(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

template <class T>
T read_le(const std::string& s, size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}

uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(at < s.size());
    const auto byte = static_cast<unsigned char>(s[at++]);
    v |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if (!(byte & 0x80)) return v;
  }
}

// What a reader takes from one Event: the fields Kiln writes.
struct Decoded {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version, tag;
  float value = 0;
  bool has_value = false;
};

// A protobuf reader of exactly the fields an Event of Kiln's holds; anything else fails the test.
Decoded decode_event(const std::string& e) {
  Decoded d;
  size_t at = 0;
  while (at < e.size()) {
    const uint64_t key = read_varint(e, at);
    if (key == (1 << 3 | 1)) {
      d.wall_time = read_le<double>(e, at);
      at += 8;
    } else if (key == (2 << 3 | 0)) {
      d.step = static_cast<int64_t>(read_varint(e, at));
    } else if (key == (3 << 3 | 2)) {
      const uint64_t n = read_varint(e, at);
      d.file_version = e.substr(at, n);
      at += n;
    } else if (key == (5 << 3 | 2)) {  // Summary { Value value = 1 }
      const std::string summary = e.substr(at, read_varint(e, at));
      at += summary.size();
      size_t s = 0;
      REQUIRE(read_varint(summary, s) == (1 << 3 | 2));
      const std::string value = summary.substr(s, read_varint(summary, s));
      size_t v = 0;
      REQUIRE(read_varint(value, v) == (1 << 3 | 2));
      const uint64_t n = read_varint(value, v);
      d.tag = value.substr(v, n);
      v += n;
      REQUIRE(read_varint(value, v) == (2 << 3 | 5));
      d.value = read_le<float>(value, v);
      d.has_value = true;
    } else {
      FAIL("an Event field Kiln does not write: key " << key);
    }
  }
  return d;
}

}  // namespace

TEST_CASE("tensorboard: CRC-32C and its mask are TFRecord's", "[data]") {
  const std::string check = "123456789";
  CHECK(tb::crc32c(check.data(), check.size()) == 0xE3069283u);  // the CRC-32C check value
  CHECK(tb::masked_crc32c(check.data(), check.size()) == 0xc78ab0e5u);  // TensorBoard's masked_crc32c
  CHECK(tb::crc32c("", 0) == 0u);
}

TEST_CASE("tensorboard: Events are encoded byte for byte as TensorBoard's protobuf classes encode them", "[data]") {
  // tests/fixtures/gen_tensorboard_golden.py
  CHECK(hex(tb::scalar_event(1764750000.25, 4096, "Train/Samples/train_loss", 2.5f)) ==
        "09000010acfc4bda411080202a210a1f0a18547261696e2f53616d706c65732f747261696e5f6c6f73731500002040");
  CHECK(hex(tb::file_version_event(1764750000.25)) == "09000010acfc4bda411a0d627261696e2e4576656e743a32");
  CHECK(hex(tb::scalar_event(12.5, -3, "x", -0.1f)) ==
        "09000000000000294010fdffffffffffffffff012a0a0a080a017815cdccccbd");
  // The record around the first: length, masked CRC of the length, payload, masked CRC of the payload.
  const std::string payload = tb::scalar_event(1764750000.25, 4096, "Train/Samples/train_loss", 2.5f);
  const std::string record = tb::tf_record(payload);
  REQUIRE(record.size() == 8 + 4 + payload.size() + 4);
  CHECK(read_le<uint64_t>(record, 0) == payload.size());
  CHECK(read_le<uint32_t>(record, 8) == 0x501d5d6du);
  CHECK(record.substr(12, payload.size()) == payload);
  CHECK(read_le<uint32_t>(record, 12 + payload.size()) == 0x7d9cc603u);
}

TEST_CASE("tensorboard: a SummaryWriter's file reads back, record by record", "[data]") {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("kiln-tb-{}", ::getpid());
  std::filesystem::remove_all(dir);
  std::string path;
  {
    tb::SummaryWriter writer((dir / "run" / "a").string());  // parents made
    path = writer.path();
    CHECK(std::filesystem::path(path).parent_path() == dir / "run" / "a");
    CHECK(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
    for (int64_t step = 0; step < 5; ++step) writer.add_scalar("Train/loss", 3.0 - 0.5 * step, 8 * step, 100.0 + step);
    // A tag that is not UTF-8 (a stray byte, an overlong '/', a surrogate, a cut sequence, past
    // U+10FFFF) is an Error before anything is written: TensorBoard's parser rejects such a string.
    for (const char* bad : {"loss\xff", "a\xc0\xaf", "\xed\xa0\x80", "\xe2\x82", "\xf4\x90\x80\x80"}) {
      CHECK_THROWS_WITH(writer.add_scalar(bad, 1, 1), Catch::Contains("the tag is not valid UTF-8"));
    }
    writer.add_scalar("Train/lr", 1e-3, 40);  // now
    writer.flush();
    writer.close();
    CHECK_THROWS_WITH(writer.add_scalar("x", 1, 1), Catch::Contains("is closed"));
    CHECK_THROWS_WITH(tb::SummaryWriter("/proc/kiln-not-here"), Catch::Contains("cannot create the directory"));
  }
  std::vector<Decoded> events;
  for (const std::string& payload : tb::read_tf_records(path)) events.push_back(decode_event(payload));
  REQUIRE(events.size() == 7);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK_FALSE(events[0].has_value);
  CHECK(events[0].wall_time > 1.7e9);  // written now
  for (int64_t step = 0; step < 5; ++step) {
    const Decoded& e = events[static_cast<size_t>(step + 1)];
    CHECK(e.tag == "Train/loss");
    CHECK(e.step == 8 * step);
    CHECK(e.value == static_cast<float>(3.0 - 0.5 * step));
    CHECK(e.wall_time == 100.0 + step);
  }
  CHECK(events[6].tag == "Train/lr");
  CHECK(events[6].value == 1e-3f);
  CHECK(events[6].step == 40);
  CHECK(events[6].wall_time >= events[0].wall_time);
  // A record cut off at the end (a writer stopped mid-record) ends what reads back; a changed byte
  // is an Error naming the record.
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto write = [](const std::filesystem::path& p, const std::string& b) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << b;
    return p.string();
  };
  const size_t last = bytes.size() - tb::tf_record(tb::scalar_event(0, 40, "Train/lr", 1e-3f)).size();
  for (size_t keep : {bytes.size() - 1, last + 12, last + 5, last}) {
    INFO("kept " << keep << " bytes of " << bytes.size());
    CHECK(tb::read_tf_records(write(dir / "cut", bytes.substr(0, keep))).size() == 6);
  }
  std::string flipped = bytes;
  flipped[last + 20] ^= 1;
  CHECK_THROWS_WITH(tb::read_tf_records(write(dir / "flipped", flipped)),
                    Catch::Contains("payload of record 6") && Catch::Contains(fmt::format("at byte {}", last)));
  flipped = bytes;
  flipped[last] ^= 1;  // its length
  CHECK_THROWS_WITH(tb::read_tf_records(write(dir / "length", flipped)), Catch::Contains("the length of record 6"));
  CHECK_THROWS_WITH(tb::read_tf_records((dir / "absent").string()), Catch::Contains("cannot open"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("tensorboard: tags in UTF-8 of every length of sequence are written as they are", "[data]") {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("kiln-tb-utf8-{}", ::getpid());
  std::filesystem::remove_all(dir);
  const std::string tag = "Verlust/\xc3\xa9tape \xe2\x82\xac \xf0\x9f\x94\xa5";  // 2-, 3- and 4-byte forms
  std::string path;
  {
    tb::SummaryWriter writer(dir.string());
    path = writer.path();
    writer.add_scalar(tag, 2.5, 7, 100.0);
  }
  const std::vector<std::string> records = tb::read_tf_records(path);
  REQUIRE(records.size() == 2);
  CHECK(records[1] == tb::scalar_event(100.0, 7, tag, 2.5f));
  std::filesystem::remove_all(dir);
}

TEST_CASE("read_tf_records: a directory, a device or a FIFO is an Error, not a hang", "[data]") {
  // A directory threw std::ios_base::failure; /dev/zero was read forever.
  test::check_error([] { tb::read_tf_records("/dev/zero"); }, {"read_tf_records", "'/dev/zero' is not a regular file"});
  test::check_error([] { tb::read_tf_records("/tmp"); }, {"read_tf_records", "not a regular file"});
  const std::string fifo = (std::filesystem::temp_directory_path() / ("kiln_fifo_" + std::to_string(::getpid()))).string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  test::check_error([&] { tb::read_tf_records(fifo); }, {"not a regular file"});
  std::filesystem::remove(fifo);
}
