// tests/data/test_datasets.cpp: TensorDataset, Dataset's default get_batch, SyntheticImages and
// ByteText.
#include "data/files.h"
#include "support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

// Only get(): batches come from Dataset's default get_batch, which stacks.
class Squares : public data::Dataset {
 public:
  int64_t size() const override { return 5; }
  data::Example get(int64_t i) const override {
    data::check_index("Squares", i, size());
    return {full({2, 2}, static_cast<double>(i * i)), scalar_tensor(i, kInt64)};
  }
};

}  // namespace

TEST_CASE("Dataset: the default get_batch stacks get()s", "[data]") {
  Squares squares;
  auto batch = squares.get_batch({3, 1});
  CHECK(batch.data.sizes() == Shape{2, 2, 2});
  CHECK(batch.data.to_vector<float>() == std::vector<float>{9, 9, 9, 9, 1, 1, 1, 1});
  CHECK(batch.target.to_vector<int64_t>() == std::vector<int64_t>{3, 1});
  check_error([&] { squares.get_batch({5}); }, {"Squares", "index 5", "5 samples"});
}

TEST_CASE("TensorDataset: samples and batches are rows of its tensors", "[data]") {
  Tensor x = sample({6, 3}), y = arange(6) * 10;
  data::TensorDataset ds(x, y);
  CHECK(ds.size() == 6);
  auto one = ds.get(4);
  check_equal(one.data, x[4]);
  CHECK(one.target.item<int64_t>() == 40);
  auto batch = ds.get_batch({5, 0, 5});
  check_equal(batch.data, stack({x[5], x[0], x[5]}));
  CHECK(batch.target.to_vector<int64_t>() == std::vector<int64_t>{50, 0, 50});
  check_error([&] { ds.get(6); }, {"TensorDataset", "index 6"});
  check_error([&] { ds.get_batch({-1}); }, {"TensorDataset", "index -1"});
  check_error(
      [] {
        data::TensorDataset(zeros({3, 2}), zeros({4}));
      },
      {"TensorDataset", "[3, 2]", "[4]", "dim 0"});
}

TEST_CASE("SyntheticImages: Fashion-MNIST's layout, deterministic per index", "[data]") {
  data::SyntheticImages ds(1000, {1, 28, 28}, 10, /*seed=*/3);
  CHECK(ds.size() == 1000);
  auto batch = ds.get_batch({0, 17, 999});
  CHECK(batch.data.sizes() == Shape{3, 1, 28, 28});
  CHECK(batch.data.dtype() == kFloat32);
  CHECK(batch.target.to_vector<int64_t>() == std::vector<int64_t>{0, 7, 9});
  CHECK(batch.data.min().item<float>() >= 0.0f);
  CHECK(batch.data.max().item<float>() <= 1.0f);
  // Sample i is the same however it is asked for; another seed gives other images.
  check_equal(ds.get(17).data, batch.data[1]);
  check_equal(data::SyntheticImages(1000, {1, 28, 28}, 10, 3).get(999).data, batch.data[2]);
  CHECK((data::SyntheticImages(1000, {1, 28, 28}, 10, 4).get(17).data - batch.data[1])
            .abs()
            .max()
            .item<float>() > 0.1f);
  // Two samples of one class differ (noise) but less than two of different classes.
  const Tensor a = ds.get(3).data, b = ds.get(13).data, c = ds.get(4).data;
  const float same = (a - b).square().mean().item<float>(),
              other = (a - c).square().mean().item<float>();
  CHECK(same > 0.0f);
  CHECK(same < other);
  auto rgb = data::SyntheticImages(4, {3, 8, 8}, 2, 0).get_batch({0, 1, 2, 3});
  CHECK(rgb.data.sizes() == Shape{4, 3, 8, 8});
  CHECK(rgb.target.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 0, 1});
  check_error([] { data::SyntheticImages(4, {28, 28}); }, {"SyntheticImages", "(C, H, W)"});
  check_error([] { data::SyntheticImages(4, {1, 28, 28}, 0); }, {"num_classes"});
}

TEST_CASE("SyntheticImages: learnable (a nearest-mean classifier gets most right)", "[data]") {
  data::SyntheticImages ds(2000, {1, 28, 28}, 10, /*seed=*/0);
  std::vector<int64_t> first(1000), second(1000);
  std::iota(first.begin(), first.end(), 0);
  std::iota(second.begin(), second.end(), 1000);
  auto train = ds.get_batch(first), test = ds.get_batch(second);
  // Class means from the first 1000, then each of the next 1000 to its nearest mean.
  std::vector<Tensor> means;
  for (int64_t c = 0; c < 10; ++c) {
    means.push_back(train.data.flatten(1).index_select(0, arange(c, 1000, 10)).mean({0}));
  }
  Tensor centres = stack(means);                                           // (10, 784)
  Tensor diff = test.data.flatten(1).unsqueeze(1) - centres.unsqueeze(0);  // (1000, 10, 784)
  Tensor predicted = diff.square().sum({2}).argmin(1);
  const double accuracy = predicted.eq(test.target).to(kFloat64).mean().item<double>();
  CHECK(accuracy > 0.95);
}

TEST_CASE("ByteText: windows of T bytes and the T that follow, at offsets uniform below N - T - 1",
          "[data]") {
  TempDir dir;
  Bytes text;
  for (int i = 0; i < 300; ++i) text.push_back(static_cast<uint8_t>((i * 7) % 251));
  write_bytes(dir / "corpus.txt", text);
  data::ByteText corpus(dir / "corpus.txt");
  REQUIRE(corpus.size() == 300);
  CHECK(corpus.bytes() == text);
  const int64_t batch = 64, T = 16;
  Generator gen(42);
  auto [x, y] = corpus.sample(batch, T, gen);
  CHECK(x.sizes() == Shape{batch, T});
  CHECK(y.sizes() == Shape{batch, T});
  CHECK(x.dtype() == kInt64);
  // The offsets are randint(0, N - T - 1) from the same generator state.
  Generator again(42);
  const auto offsets = randint(0, 300 - T - 1, {batch}, kInt64, &again).to_vector<int64_t>();
  const auto xs = x.to_vector<int64_t>(), ys = y.to_vector<int64_t>();
  int64_t wrong = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      wrong += xs[b * T + t] != text[offsets[b] + t];
      wrong += ys[b * T + t] != text[offsets[b] + t + 1];
    }
  }
  CHECK(wrong == 0);
  CHECK(gen.offset() == again.offset());  // the sample consumed exactly that draw
  // The generator moves on: the next sample differs.
  CHECK(corpus.sample(batch, T, gen).data.to_vector<int64_t>() != xs);

  // Shortest corpus: N = T + 2 has the one offset 0.
  data::ByteText tiny(Bytes{1, 2, 3, 4, 5, 6});
  auto w = tiny.sample(3, 4, gen);
  CHECK(w.data.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4});
  CHECK(w.target.to_vector<int64_t>() == std::vector<int64_t>{2, 3, 4, 5, 2, 3, 4, 5, 2, 3, 4, 5});
  check_error([&] { tiny.sample(1, 5, gen); },
              {"ByteText", "6 bytes", "fewer than context + 2 = 7"});
  check_error([&] { tiny.sample(0, 2, gen); }, {"ByteText::sample", "batch (0)"});
  write_bytes(dir / "short.txt", {'a', 'b'});
  check_error([&] { data::ByteText(dir / "short.txt").sample(1, 1, gen); },
              {"short.txt", "2 bytes"});
  // A gzip'd corpus reads as its text.
  write_bytes(dir / "corpus.txt.gz", gzip(text));
  CHECK(data::ByteText(dir / "corpus.txt.gz").bytes() == text);
}

TEST_CASE("SyntheticImages: sizes whose product wraps past 2^63 are an Error", "[data]") {
  // 2^62 x 4 x 1 wrapped to 0 elements, and get() wrote past the empty patterns (SIGSEGV).
  check_error([] { data::SyntheticImages(10, {int64_t{1} << 62, 4, 1}); }, {"SyntheticImages", "more than it can hold"});
  check_error([] { data::SyntheticImages(10, {int64_t{1} << 40, int64_t{1} << 40, 1}); }, {"SyntheticImages"});
}
