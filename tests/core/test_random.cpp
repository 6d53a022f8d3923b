// tests/core/test_random.cpp: Philox4x32-10 against the published known-answer vectors, and the random
// factories: reproducible by seed, independent of thread count, with the right ranges and moments.
#include "support.h"

#include "core/philox.h"

using namespace kiln;

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors") {
  auto r = Philox4x32::block({0, 0, 0, 0}, 0, 0);
  CHECK(r == std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  r = Philox4x32::block({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, 0xffffffffu, 0xffffffffu);
  CHECK(r == std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  r = Philox4x32::block({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, 0xa4093822u, 0x299f31d0u);
  CHECK(r == std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("Philox4x32::words8 equals eight calls of words, across a carry into the counter's high half") {
  for (uint64_t counter : {uint64_t{0}, uint64_t{0xfffffffcu}, uint64_t{0x123456789abcdefull}}) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{67280421310721ull}, ~uint64_t{0}}) {
      INFO("counter " << counter << ", seed " << seed);
      uint32_t w[4][8];
      Philox4x32::words8(seed, counter, w);
      for (int c = 0; c < 8; ++c) {
        const auto r = Philox4x32::words(seed, counter + c);
        for (int k = 0; k < 4; ++k) CHECK(w[k][c] == r[k]);
      }
    }
  }
}

TEST_CASE("bernoulli_word is its uniform below a, at the words around the threshold") {
  // The integer threshold must decide exactly as the uniform (w0 >> 8) 2^-24 < a does.
  for (double a : {0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0 - 0x1.0p-30, 1.0}) {
    const uint32_t t = bernoulli_threshold(a);
    for (int64_t x = static_cast<int64_t>(t) - 2; x <= static_cast<int64_t>(t) + 2; ++x) {
      if (x < 0 || x >= (int64_t{1} << 24)) continue;
      INFO("a = " << a << ", x = " << x);
      const uint32_t w0 = (static_cast<uint32_t>(x) << 8) | 0xffu;
      CHECK(bernoulli_word(w0, a) == (static_cast<double>(x) * 0x1.0p-24 < a));
    }
  }
}

TEST_CASE("each element of a draw is random_value of its index: whole draws and parts") {
  // The CPU kernel makes its words 8 counters at a time; every element must still be the one the
  // scalar definition gives, from any offset, for any length, and in a part whose runs jump.
  Generator g(91);
  for (int64_t n : {1, 2, 15, 16, 17, 33, 1000}) {
    INFO("n = " << n << ", offset " << g.offset());
    uint64_t offset = g.offset();
    std::vector<float> u = rand({n}, kFloat32, &g).to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      CHECK(u[i] == static_cast<float>(random_value<false>(RandomKind::Uniform, 91, offset, i, 0, 1)));
    }
    offset = g.offset();
    std::vector<double> z = randn({n}, kFloat64, &g).to_vector<double>();
    for (int64_t i = 0; i < n; ++i) CHECK(z[i] == random_value<true>(RandomKind::Normal, 91, offset, i, 0, 1));
    offset = g.offset();
    std::vector<float> b = bernoulli({n}, 0.3, kFloat32, &g).to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      CHECK(b[i] == static_cast<float>(random_value<false>(RandomKind::Bernoulli, 91, offset, i, 0.3, 0)));
    }
  }
  // A part: (4, 3 of 7, 5) of a (4, 7, 5) draw, from heads 2 (runs of 15, 35 apart, starting at 10).
  const uint64_t offset = g.offset();
  std::vector<float> kept = dropout_part(ones({4, 3, 5}), 0.5, true, 1, 2, 7, &g).to_vector<float>();
  for (int64_t i = 0; i < 60; ++i) {
    const int64_t e = (i / 15) * 35 + 10 + i % 15;
    CHECK(kept[i] == 2.0f * static_cast<float>(random_value<false>(RandomKind::Bernoulli, 91, offset, e, 0.5, 0)));
  }
}

TEST_CASE("manual_seed makes random tensors reproducible, and draws advance the stream") {
  manual_seed(42);
  Tensor a = rand({1000});
  Tensor b = rand({1000});
  manual_seed(42);
  Tensor a2 = rand({1000});
  test::check_equal(a, a2);
  CHECK(a.to_vector<float>() != b.to_vector<float>());
  Generator g(7), g2(7);
  test::check_equal(randn({5, 5}, {}, &g), randn({5, 5}, {}, &g2));
}

TEST_CASE("the numbers do not depend on the thread count") {
  // Odd sizes and 3 threads too, so that a thread's piece can start in the middle of a counter's
  // pair of elements (and of the CPU kernel's groups of 8 counters).
  for (int64_t n : {200000, 200001, 199999}) {
    INFO("n = " << n);
    Tensor serial, uniform;
    {
      test::ThreadsGuard one(1);
      manual_seed(3);
      serial = randn({n});
      uniform = rand({n});
    }
    for (int threads : {2, 3}) {
      INFO(threads << " threads");
      test::ThreadsGuard guard(threads);
      manual_seed(3);
      test::check_equal(randn({n}), serial);
      test::check_equal(rand({n}), uniform);
    }
  }
}

TEST_CASE("element i is the documented function of (seed, offset, i)") {
  // Note [random element mapping]: uniform float = (w0 >> 8) * 2^-24 of counter offset + i/2.
  Generator g(1234);
  Tensor u = rand({6}, {}, &g);
  std::vector<float> got = u.to_vector<float>();
  for (uint64_t i = 0; i < 6; ++i) {
    uint32_t w0, w1;
    Philox4x32::element_words(1234, 0, i, w0, w1);
    CHECK(got[i] == static_cast<float>((w0 >> 8) * 0x1.0p-24));
  }
  CHECK(g.offset() == 3);  // 6 elements, 2 per counter
}

TEST_CASE("randint is low + (w0 << 32 | w1) mod (high - low), exact over all of int64") {
  // Note [random element mapping], computed here in unsigned 64-bit arithmetic; ranges beyond 2^53
  // (which a double cannot hold) included.
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {-3, 5}, {(int64_t{1} << 60) + 1, (int64_t{1} << 60) + 9}, {INT64_MIN, INT64_MAX}, {INT64_MAX - 2, INT64_MAX},
      {-(int64_t{1} << 62), int64_t{1} << 62}};
  for (auto [low, high] : ranges) {
    INFO("[" << low << ", " << high << ")");
    Generator g(77);
    std::vector<int64_t> got = randint(low, high, {9}, kInt64, &g).to_vector<int64_t>();
    const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
    for (uint64_t i = 0; i < 9; ++i) {
      uint32_t w0, w1;
      Philox4x32::element_words(77, 0, i, w0, w1);
      const uint64_t word = (uint64_t{w0} << 32) | w1;
      CHECK(got[i] == static_cast<int64_t>(static_cast<uint64_t>(low) + word % range));
      CHECK((got[i] >= low && got[i] < high));
    }
  }
  // Shifting the range shifts the draw, also beyond 2^53.
  Generator g1(5), g2(5);
  const int64_t base = (int64_t{1} << 60) + 3;
  test::check_equal(randint(base, base + 1000, {257}, kInt64, &g1) - base, randint(0, 1000, {257}, kInt64, &g2));
  // Other dtypes take the same integers, converted.
  Generator g3(8), g4(8);
  test::check_equal(randint(-2048, 2049, {300}, kFloat16, &g3), randint(-2048, 2049, {300}, kInt64, &g4).to(kFloat16));
}

TEST_CASE("randperm is Fisher-Yates on keys below 2^63 - 1") {
  const int64_t n = 37;
  std::vector<int64_t> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    uint32_t w0, w1;
    Philox4x32::element_words(31, 0, static_cast<uint64_t>(i), w0, w1);
    const uint64_t key = ((uint64_t{w0} << 32) | w1) % uint64_t{INT64_MAX};
    std::swap(want[i], want[key % static_cast<uint64_t>(i + 1)]);
  }
  Generator g(31);
  CHECK(randperm(n, kInt64, &g).to_vector<int64_t>() == want);
  CHECK(g.offset() == (n + 1) / 2);
}

TEST_CASE("uniform, normal, randint, randperm and bernoulli have their ranges and moments") {
  manual_seed(0);
  Tensor u = rand({100000});
  CHECK(u.min().item<double>() >= 0.0);
  CHECK(u.max().item<double>() < 1.0);
  CHECK(u.mean().item<double>() == Approx(0.5).margin(0.005));
  Tensor n = randn({100000}, kFloat64);
  CHECK(n.mean().item<double>() == Approx(0.0).margin(0.01));
  CHECK(n.std().item<double>() == Approx(1.0).margin(0.01));
  Tensor r = randint(-3, 5, {10000});
  CHECK(r.dtype() == kInt64);
  CHECK(r.min().item<int64_t>() == -3);
  CHECK(r.max().item<int64_t>() == 4);
  Tensor p = randperm(100);
  std::vector<int64_t> v = p.to_vector<int64_t>();
  std::sort(v.begin(), v.end());
  for (int64_t i = 0; i < 100; ++i) CHECK(v[i] == i);
  CHECK(p.to_vector<int64_t>() != v);  // actually shuffled
  Tensor bern = bernoulli({100000}, 0.3);
  CHECK(bern.mean().item<double>() == Approx(0.3).margin(0.01));
  test::check_error([] { randint(5, 5, {2}); }, {"randint", "low < high"});
  test::check_error([] { rand({2}, kInt64); }, {"rand", "floating"});
}
