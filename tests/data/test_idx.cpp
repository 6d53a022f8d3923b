// tests/data/test_idx.cpp: the IDX reader and MNIST / FashionMNIST on small hand-built files (plain
// and gzip'd), a table of bad files, and Debian's Fashion-MNIST itself when it is installed.
#include <sys/stat.h>

#include <filesystem>
#include <numeric>

#include "data/files.h"
#include "support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

void put_be32(Bytes& out, uint32_t v) {
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<uint8_t>(v >> shift));
}

Bytes idx(uint32_t magic, const std::vector<uint32_t>& dims, const Bytes& values) {
  Bytes out;
  put_be32(out, magic);
  for (uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), values.begin(), values.end());
  return out;
}

// Pixel p of image i in the hand-built sets.
uint8_t pixel(int64_t i, int64_t p) { return static_cast<uint8_t>((i * 37 + p * 5) % 256); }

Bytes images(int64_t n, uint32_t rows = 28, uint32_t cols = 28) {
  Bytes values;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < rows * cols; ++p) values.push_back(pixel(i, p));
  }
  return idx(data::kIdxImagesMagic, {static_cast<uint32_t>(n), rows, cols}, values);
}

Bytes labels(const Bytes& values) {
  return idx(data::kIdxLabelsMagic, {static_cast<uint32_t>(values.size())}, values);
}

Bytes values_of(const data::IdxArray& a, size_t n) { return Bytes(a.data(), a.data() + n); }

}  // namespace

TEST_CASE("IDX: read_idx gives dims and bytes, gzip'd or plain", "[data][idx]") {
  TempDir dir;
  Bytes values;
  for (int v = 0; v < 2 * 3 * 4; ++v) values.push_back(static_cast<uint8_t>(250 - 7 * v));
  const Bytes file = idx(data::kIdxImagesMagic, {2, 3, 4}, values);
  write_bytes(dir / "a-ubyte", file);
  write_bytes(dir / "a-ubyte.gz", gzip(file));
  for (const char* name : {"a-ubyte", "a-ubyte.gz"}) {
    CAPTURE(name);
    data::IdxArray a = data::read_idx(dir / name, data::kIdxImagesMagic);
    CHECK(a.dims == std::vector<int64_t>{2, 3, 4});
    CHECK(values_of(a, 24) == values);
  }
  // A file of two gzip members reads as their concatenation (as gunzip does).
  Bytes two = gzip(Bytes(file.begin(), file.begin() + 10));
  const Bytes tail = gzip(Bytes(file.begin() + 10, file.end()));
  two.insert(two.end(), tail.begin(), tail.end());
  write_bytes(dir / "two.gz", two);
  CHECK(values_of(data::read_idx(dir / "two.gz", data::kIdxImagesMagic), 24) == values);
}

TEST_CASE("MNIST: hand-built files read value by value", "[data][idx]") {
  TempDir dir;
  write_bytes(dir / "train-images-idx3-ubyte.gz", gzip(images(3)));
  write_bytes(dir / "train-labels-idx1-ubyte.gz", gzip(labels({3, 0, 9})));
  write_bytes(dir / "t10k-images-idx3-ubyte", images(2));  // plain files are read too
  write_bytes(dir / "t10k-labels-idx1-ubyte", labels({7, 1}));

  auto train = data::MNIST::train(dir.path().string());
  REQUIRE(train.size() == 3);
  auto batch = train.get_batch({2, 0});
  REQUIRE(batch.data.sizes() == Shape{2, 1, 28, 28});
  CHECK(batch.data.dtype() == kFloat32);
  CHECK(batch.target.dtype() == kInt64);
  CHECK(batch.target.to_vector<int64_t>() == std::vector<int64_t>{9, 3});
  const auto x = batch.data.to_vector<float>();
  int64_t wrong = 0;
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t i = b == 0 ? 2 : 0;
    for (int64_t p = 0; p < 784; ++p) {
      wrong += x[b * 784 + p] != static_cast<float>(pixel(i, p)) / 255.0f;
    }
  }
  CHECK(wrong == 0);
  auto one = train.get(1);
  CHECK(one.data.sizes() == Shape{1, 28, 28});
  CHECK(one.target.dim() == 0);
  CHECK(one.target.item<int64_t>() == 0);
  CHECK(one.data.to_vector<float>()[5] == static_cast<float>(pixel(1, 5)) / 255.0f);
  CHECK(train.label(2) == 9);
  // torchvision's `data` and `targets`.
  Tensor all = train.data();
  CHECK(all.dtype() == kUInt8);
  REQUIRE(all.sizes() == Shape{3, 28, 28});
  CHECK(all[2][3][4].item<int64_t>() == pixel(2, 3 * 28 + 4));
  CHECK(all[0].reshape({-1}).to_vector<int64_t>()[700] == pixel(0, 700));
  check_close(all.to(kFloat32).div(255).index_select(0, from_vector<int64_t>({2, 0})).unsqueeze(1), batch.data);
  CHECK(train.targets().to_vector<int64_t>() == std::vector<int64_t>{3, 0, 9});
  check_error([&] { train.get(3); }, {"MNIST", "index 3", "3 samples"});

  auto test = data::MNIST::test(dir.path().string());
  CHECK(test.size() == 2);
  CHECK(test.get_batch({0, 1}).target.to_vector<int64_t>() == std::vector<int64_t>{7, 1});
  CHECK(test.image_bytes(1)[100] == pixel(1, 100));

  // Through a DataLoader, as a training loop reads it.
  data::DataLoader loader(train, {.batch_size = 2});
  std::vector<int64_t> sizes;
  for (auto& [xb, yb] : loader) sizes.push_back(xb.size(0));
  CHECK(sizes == std::vector<int64_t>{2, 1});
}

TEST_CASE("IDX: bad files are Errors that say what is wrong", "[data][idx]") {
  TempDir dir;
  const Bytes good_images = images(2);
  const Bytes good_labels = labels({1, 2});
  Bytes truncated_gz = gzip(good_images);
  truncated_gz.resize(truncated_gz.size() / 2);
  Bytes bad_crc_gz = gzip(good_images);
  bad_crc_gz[bad_crc_gz.size() - 6] ^= 0xff;  // the CRC-32 in the trailer
  Bytes garbage_gz = gzip(good_images);
  for (size_t i = 12; i < 40; ++i) garbage_gz[i] = static_cast<uint8_t>(i * 31);
  Bytes long_images = good_images;
  long_images.push_back(0);

  struct Case {
    const char* what;
    Bytes bytes;
    uint32_t magic;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"empty", {}, data::kIdxImagesMagic, {"too short for the 4-byte magic"}},
      {"labels read as images",
       good_labels,
       data::kIdxImagesMagic,
       {"magic number 0x00000801, expected 0x00000803"}},
      {"images read as labels",
       good_images,
       data::kIdxLabelsMagic,
       {"magic number 0x00000803, expected 0x00000801"}},
      {"not IDX",
       {'h', 'e', 'l', 'l', 'o', '!'},
       data::kIdxLabelsMagic,
       {"magic number 0x68656c6c"}},
      {"header cut",
       Bytes(good_images.begin(), good_images.begin() + 10),
       data::kIdxImagesMagic,
       {"too short for the header of 3 dims (16 bytes)"}},
      {"data cut",
       Bytes(good_images.begin(), good_images.end() - 1),
       data::kIdxImagesMagic,
       {"1567 bytes of data", "expected 1568 (2 x 28 x 28)", "truncated"}},
      {"trailing byte",
       long_images,
       data::kIdxImagesMagic,
       {"1569 bytes of data", "expected 1568", "trailing bytes"}},
      {"huge dims",
       idx(data::kIdxImagesMagic, {60000, 28, 28}, {1, 2, 3}),
       data::kIdxImagesMagic,
       {"need more bytes than the file's 19"}},
      {"truncated gzip", truncated_gz, data::kIdxImagesMagic, {"truncated gzip stream"}},
      {"bad gzip checksum", bad_crc_gz, data::kIdxImagesMagic, {"corrupt gzip data"}},
      {"corrupt gzip data", garbage_gz, data::kIdxImagesMagic, {"corrupt gzip data"}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    const std::string path = dir / "bad";
    write_bytes(path, c.bytes);
    std::vector<std::string> fragments = c.fragments;
    fragments.push_back(path);
    check_error([&] { data::read_idx(path, c.magic); }, fragments);
  }
  check_error([&] { data::read_idx(dir.path().string(), data::kIdxLabelsMagic); },
              {"is not a regular file"});
  // A FIFO: an Error at once, not a wait for a writer to open it.
  const std::string fifo = dir / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  check_error([&] { data::read_idx(fifo, data::kIdxLabelsMagic); }, {"is not a regular file", fifo});
  check_error([&] { data::read_idx(dir / "absent", data::kIdxLabelsMagic); },
              {"cannot open", "absent", "No such file"});
}

TEST_CASE("MNIST: inconsistent files and missing files are Errors", "[data][idx]") {
  TempDir dir;
  const std::string root = dir.path().string();
  auto put = [&](const Bytes& imgs, const Bytes& lbls) {
    write_bytes(dir / "train-images-idx3-ubyte", imgs);
    write_bytes(dir / "train-labels-idx1-ubyte.gz", gzip(lbls));
  };
  put(images(2, 27, 28), labels({1, 2}));
  check_error([&] { data::MNIST::train(root); },
              {"MNIST", "holds 27 x 28 images, expected 28 x 28"});
  put(images(3), labels({1, 2}));
  check_error([&] { data::MNIST::train(root); },
              {"train-images-idx3-ubyte' holds 3 images", "train-labels-idx1-ubyte.gz' 2 labels"});
  put(images(2), labels({1, 10}));
  check_error([&] { data::MNIST::train(root); }, {"label 10 at index 1 is not in [0, 10)"});
  check_error([&] { data::MNIST::test(root); },
              {"MNIST: missing file", "t10k-images-idx3-ubyte.gz", "pass the folder"});
  check_error([&] { data::FashionMNIST::train(root + "/nowhere"); },
              {"FashionMNIST: missing file", "nowhere/train-images-idx3-ubyte.gz",
               "apt-get install dataset-fashion-mnist"});
}

TEST_CASE("FashionMNIST: Debian's dataset-fashion-mnist, when installed", "[data][idx][fmnist]") {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(data::FashionMNIST::kDefaultRoot) / "train-images-idx3-ubyte.gz")) {
    WARN("skipped: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)");
    return;
  }
  // Reference values from Python: gzip.open(...).read() on the same files.
  auto train = data::FashionMNIST::train();
  auto test = data::FashionMNIST::test();
  REQUIRE(train.size() == 60000);
  REQUIRE(test.size() == 10000);
  std::vector<int64_t> first_train, first_test;
  for (int i = 0; i < 10; ++i) {
    first_train.push_back(train.label(i));
    first_test.push_back(test.label(i));
  }
  CHECK(first_train == std::vector<int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  CHECK(first_test == std::vector<int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
  int64_t label_sum = 0, first_sum = 0, last_sum = 0;
  for (int64_t i = 0; i < 60000; ++i) label_sum += train.label(i);
  for (int p = 0; p < 784; ++p) {
    first_sum += train.image_bytes(0)[p];
    last_sum += train.image_bytes(59999)[p];
  }
  CHECK(label_sum == 270000);
  CHECK(first_sum == 76247);
  CHECK(last_sum == 16684);
  CHECK(train.data().to(kInt64).sum().item<int64_t>() == std::accumulate(
      train.image_bytes(0), train.image_bytes(0) + 60000 * 784, int64_t{0}));
  CHECK(train.data()[0].to(kInt64).sum().item<int64_t>() == 76247);
  CHECK(train.targets().sum().item<int64_t>() == 270000);
  const auto row10 = train.get(0).data.select(1, 10).to_vector<float>();  // (28) of image 0
  CHECK(row10[12] == 0.0f);
  CHECK(row10[13] == 193.0f / 255.0f);
  CHECK(row10[26] == 202.0f / 255.0f);

  // As DESIGN.md §2 writes it.
  data::DataLoader loader(data::FashionMNIST::train(), {.batch_size = 128, .shuffle = true});
  CHECK(loader.size() == 469);  // BENCHMARKS.md c, d: the last partial batch kept
  auto it = loader.begin();
  CHECK(it->data.sizes() == Shape{128, 1, 28, 28});
  CHECK(it->target.sizes() == Shape{128});
  CHECK(it->data.max().item<float>() <= 1.0f);
}

TEST_CASE("IDX: damaged gzip'd files read or raise an Error", "[data][idx]") {
  TempDir dir;
  const Bytes good = gzip(images(2));
  const std::string path = dir / "damaged.gz";
  Generator gen(9);
  const auto noise = randint(0, 1 << 30, {1500}, kInt64, &gen).to_vector<int64_t>();
  int64_t read = 0, rejected = 0;
  for (size_t k = 0; k + 2 < noise.size(); k += 3) {
    Bytes bad = good;
    bad[static_cast<size_t>(noise[k]) % bad.size()] ^= static_cast<uint8_t>(1 + noise[k + 1] % 255);
    if (noise[k + 2] % 3 == 0) bad.resize(static_cast<size_t>(noise[k + 2]) % bad.size());
    write_bytes(path, bad);
    try {
      data::read_idx(path, data::kIdxImagesMagic);
      ++read;
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains(path));
      ++rejected;
    }
  }
  CHECK(read + rejected == 500);
  CHECK(rejected > 400);  // the CRC catches nearly every change that still inflates
}
