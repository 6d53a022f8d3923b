// tests/core/test_tensor.cpp: the tensor model: storage sharing, strides of views, factories, copies,
// devices, the allocator's statistics, printing, and the Error for each misuse.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

#include "support.h"

using namespace kiln;

TEST_CASE("factories give the right shapes, dtypes and values") {
  test::check_equal(zeros({2, 3}), from_vector(std::vector<float>(6, 0.f), {2, 3}));
  test::check_equal(full({2}, 7, kInt32), from_vector(std::vector<int32_t>{7, 7}));
  test::check_equal(arange(5), from_vector(std::vector<int64_t>{0, 1, 2, 3, 4}));
  test::check_equal(arange(1, 2, 0.25), tensor({1, 1.25, 1.5, 1.75}));
  test::check_close(linspace(0, 1, 5), tensor({0, 0.25, 0.5, 0.75, 1}));
  test::check_equal(eye(2, 3), tensor({{1, 0, 0}, {0, 1, 0}}));
  CHECK(ones_like(zeros({4}, kFloat64)).dtype() == kFloat64);
  CHECK(empty({0, 3}).numel() == 0);
  CHECK(zeros({2}, TensorOptions().requires_grad(true)).requires_grad());
  test::check_error([] { zeros({2, -1}); }, {"empty", "non-negative", "[2, -1]"});
  test::check_error([] { from_vector(std::vector<float>{1, 2, 3}, {2, 2}); }, {"3 values", "[2, 2]"});
  test::check_error([] { tensor({{1, 2}, {3}}); }, {"same length"});
  test::check_error([] { zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}); }, {"0 to 8 dimensions; 9 were asked for"});
}

TEST_CASE("Shape's mutators check their positions and counts") {
  // insert(20) wrote past the inline array (a segfault), insert(-3) and erase on an empty shape
  // wrote before it, resize(-1) made a rank of -1 that a factory then walked off the stack.
  Shape s{1, 2};
  test::check_error([&] { s.insert(20, 5); }, {"Shape::insert: position 20 is out of range for a shape of 2 dims"});
  test::check_error([&] { s.insert(-3, 5); }, {"Shape::insert: position -3"});
  s.insert(2, 5);  // at the end
  s.insert(0, 7);
  CHECK(s == Shape{7, 1, 2, 5});
  s.erase(3);
  CHECK(s == Shape{7, 1, 2});
  test::check_error([&] { s.erase(3); }, {"Shape::erase: position 3 is out of range for a shape of 3 dims"});
  Shape none;
  test::check_error([&] { none.erase(0); }, {"Shape::erase: position 0"});
  test::check_error([&] { (void)none.back(); }, {"Shape::back: the shape is empty"});
  test::check_error([&] { none.resize(-1); }, {"0 to 8 dimensions; -1 were asked for"});
  test::check_error([] { zeros(Shape::filled(-1, 1)); }, {"-1 were asked for"});
  CHECK(none.size() == 0);
}

TEST_CASE("views share storage and have the expected strides") {
  Tensor x = arange(24, kFloat32).view({2, 3, 4});
  CHECK(x.strides() == Shape{12, 4, 1});
  Tensor p = x.permute({2, 0, 1});
  CHECK(p.sizes() == Shape{4, 2, 3});
  CHECK(p.strides() == Shape{1, 12, 4});
  CHECK(!p.is_contiguous());
  Tensor t = x.transpose(0, 2);
  CHECK(t.strides() == Shape{1, 4, 12});
  Tensor n = x.narrow(1, 1, 2);
  CHECK(n.storage_offset() == 4);
  CHECK(x.select(2, 3).sizes() == Shape{2, 3});
  CHECK(x.slice(2, 0, 4, 2).strides() == Shape{12, 4, 2});
  CHECK(x[1][2][3].item<float>() == 23);
  Tensor e = tensor({1, 2, 3}).unsqueeze(0).expand({4, 3});
  CHECK(e.strides() == Shape{0, 1});
  CHECK(x.flatten(1).sizes() == Shape{2, 12});
  CHECK(x.unflatten(2, {2, 2}).sizes() == Shape{2, 3, 2, 2});
  CHECK(x.view({-1, 4}).sizes() == Shape{6, 4});
  CHECK(zeros({1, 3, 1}).squeeze().sizes() == Shape{3});
  CHECK(zeros({1, 3, 1}).squeeze(0).sizes() == Shape{3, 1});
  // A write through a view is seen by the base.
  Tensor base = zeros({3, 3});
  base.select(0, 1).fill_(5);
  CHECK(base.sum().item<float>() == 15);
  CHECK(base[1][2].item<float>() == 5);
  // reshape copies when it must; view refuses and says to use reshape.
  Tensor merged = p.reshape({4, 6});  // dims 1 and 2 of p are contiguous together: still a view
  CHECK(merged.strides() == Shape{1, 4});
  CHECK(merged.impl()->storage == x.impl()->storage);
  Tensor r = p.reshape({24});  // impossible as a view: a copy
  CHECK(r.is_contiguous());
  CHECK(r.impl()->storage != x.impl()->storage);
  test::check_equal(r, p.contiguous().view({24}));
  test::check_error([&] { p.view({24}); }, {"view", "reshape"});
  test::check_error([&] { x.view({5, -1}); }, {"invalid for input of size 24"});
  test::check_error([&] { x.permute({0, 0, 1}); }, {"permute", "appears twice"});
  test::check_error([&] { x.narrow(1, 2, 2); }, {"narrow", "out of range"});
  test::check_error([&] { x.select(0, 2); }, {"select", "index 2", "size 2"});
  test::check_error([&] { x.expand({2, 5, 4}); }, {"expand", "must match"});
  test::check_error([&] { x.sum({3}); }, {"dim 3 is out of range", "3 dimensions"});
}

TEST_CASE("copies: contiguous, clone, to, copy_ and in-place version counters") {
  Tensor x = arange(6, kFloat32).view({2, 3}).t();
  Tensor c = x.contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.to_vector<float>() == std::vector<float>{0, 3, 1, 4, 2, 5});
  Tensor cl = c.clone();
  cl.fill_(1);
  CHECK(c.sum().item<float>() == 15);  // clone does not share
  Tensor d = zeros({3, 2}, kFloat64);
  uint64_t v0 = d._version();
  d.copy_(x);
  CHECK(d._version() == v0 + 1);
  CHECK(d.dtype() == kFloat64);
  test::check_close(d, x.to(kFloat64));
  Tensor row = zeros({2, 3});
  row.copy_(tensor({1, 2, 3}));  // broadcast
  CHECK(row.sum().item<float>() == 12);
  test::check_error([&] { row.copy_(zeros({4})); }, {"copy_", "[4]", "[2, 3]"});
}

TEST_CASE("item and to_vector") {
  CHECK(tensor({2.5}).item<double>() == 2.5);
  CHECK(full({}, 3, kInt64).item<int64_t>() == 3);
  test::check_error([] { zeros({2, 3}).item(); }, {"item", "[2, 3]", "6 elements"});
}

TEST_CASE("devices: parsing, and CUDA without a GPU is an Error, not a crash") {
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::parse("cpu").is_cpu());
  CHECK(Device::cuda(1).str() == "cuda:1");
  test::check_error([] { Device::parse("gpu0"); }, {"Device", "gpu0", "cuda:N"});
  // PyTorch's spellings: "cpu:0" is the CPU, "cuda:01" is not a device; an index past the range
  // is an Error where it was cut to 16 bits (70000 became cuda:4464).
  CHECK(Device::parse("cpu:0").is_cpu());
  test::check_error([] { Device::parse("cuda:01"); }, {"cannot parse \"cuda:01\""});
  test::check_error([] { Device::cuda(70000); }, {"CUDA device index 70000 is out of range", "[0, 4096)"});
  test::check_error([] { Device::cuda(-1); }, {"CUDA device index -1 is out of range"});
  test::check_error([] { zeros({2}).cuda(5000); }, {"CUDA device index 5000"});
  if (!cuda::is_available()) {
    test::check_error([] { zeros({2}, Device::cuda()); }, {"CUDA"});
  }
  float fake[2] = {0, 0};  // a tensor that only claims to be on a GPU: the check comes first
  Tensor on_gpu = from_blob(fake, {2}, kFloat32, Device::cuda(0));
  test::check_error([&] { auto keep = zeros({2}) + on_gpu; }, {"add", "one device", "cpu", "cuda:0"});
}

TEST_CASE("cuda::KernelProfiler needs a GPU: without one it is an Error that says so") {
  if (cuda::is_available()) return;  // tests/cuda/test_cuda_profiler.cpp profiles on the GPU
  test::check_error([] { cuda::KernelProfiler prof; }, {"KernelProfiler", "no CUDA device"});
}

TEST_CASE("pin_memory and non_blocking: CPU copies are plain copies, pinning needs a usable GPU") {
  Tensor x = test::sample({5});
  CHECK_FALSE(x.is_pinned());
  CHECK(x.to(Device::cpu(), /*non_blocking=*/true).is_same(x));
  Tensor wide = x.to(Device::cpu(), kFloat64, /*non_blocking=*/true);
  test::check_equal(wide, x.to(kFloat64));
  Tensor y = zeros({2, 5});
  y.copy_(x, /*non_blocking=*/true);  // broadcast into both rows
  test::check_equal(y, x.expand({2, 5}));
  test::check_error([] { (void)empty({2}, TensorOptions(Device::cuda(0)).pinned_memory(true)); },
                    {"pinned_memory", "only CPU tensors", "cuda:0"});
  if (cuda::is_available()) {  // a GPU machine: tests/cuda/test_cuda_pinned.cpp has the rest
    CHECK(x.pin_memory().is_pinned());
  } else {
    test::check_error([&] { (void)x.pin_memory(); },
                      {"pin_memory", "no CUDA device is usable", "ordinary CPU tensors"});
    test::check_error([] { (void)zeros({3}, TensorOptions().pinned_memory(true)); },
                      {"pinned_memory", "no CUDA device"});
    test::check_error([] { (void)tensor({1, 2}, TensorOptions().pinned_memory(true)); },
                      {"pinned_memory", "no CUDA device"});
  }
}

TEST_CASE("the CPU allocator is 64-byte aligned and its statistics return to baseline") {
  MemoryStats before = memory::stats(Device::cpu());
  {
    Tensor a = empty({1000});
    CHECK(reinterpret_cast<uintptr_t>(a.data_ptr()) % 64 == 0);
    Tensor b = empty({3}, kFloat64);
    CHECK(reinterpret_cast<uintptr_t>(b.data_ptr()) % 64 == 0);
    MemoryStats during = memory::stats(Device::cpu());
    CHECK(during.allocated_bytes - before.allocated_bytes == 4000 + 24);
    CHECK(during.allocation_count - before.allocation_count == 2);
    CHECK(during.peak_allocated_bytes >= during.allocated_bytes);
  }
  MemoryStats after = memory::stats(Device::cpu());
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.free_count - before.free_count == 2);
  memory::reset_peak(Device::cpu());
  CHECK(memory::stats(Device::cpu()).peak_allocated_bytes == after.allocated_bytes);
}

TEST_CASE("the CPU allocator's failure is an OutOfMemoryError that gives the size") {
#ifdef __SANITIZE_ADDRESS__
  // AddressSanitizer's allocator aborts on a failed allocation unless told to return null, as the
  // asan test preset tells it.
  const char* asan = std::getenv("ASAN_OPTIONS");
  if (asan == nullptr || std::string(asan).find("allocator_may_return_null=1") == std::string::npos) {
    WARN("skipped: AddressSanitizer without allocator_may_return_null=1");
    return;
  }
#endif
  const MemoryStats before = memory::stats(Device::cpu());
  // 2^47 bytes: more than a process's address space, so no overcommit setting grants it.
  const Shape huge{int64_t{1} << 45};
  CHECK_THROWS_AS(empty(huge), OutOfMemoryError);
  test::check_error([&] { (void)empty(huge); }, {"out of CPU memory: could not allocate 140737488355328 bytes"});
  CHECK(memory::stats(Device::cpu()).allocated_bytes == before.allocated_bytes);
  CHECK(ones({3}).sum().item<float>() == 3.0f);  // and the allocator still works
}

TEST_CASE("the CPU allocator reuses a large freed block and empty_cache gives it back") {
  memory::empty_cache(Device::cpu());
  MemoryStats base = memory::stats(Device::cpu());
  CHECK(base.reserved_bytes == base.allocated_bytes);
  void* first = nullptr;
  {
    Tensor big = empty({1 << 18});  // 1 MiB: cached when freed
    first = big.data_ptr();
  }
  MemoryStats after_free = memory::stats(Device::cpu());
  CHECK(after_free.allocated_bytes == base.allocated_bytes);
#if !defined(__SANITIZE_ADDRESS__)  // the cache is off under AddressSanitizer
  CHECK(after_free.reserved_bytes == base.reserved_bytes + (1 << 20));
  {
    Tensor again = empty({1 << 18});
    CHECK(again.data_ptr() == first);  // the same block, no new pages
    CHECK(memory::stats(Device::cpu()).reserved_bytes == base.reserved_bytes + (1 << 20));
    Tensor other = empty({(1 << 18) + 1000});  // another size class: a new block
    CHECK(other.data_ptr() != first);
  }
#endif
  memory::empty_cache(Device::cpu());
  MemoryStats emptied = memory::stats(Device::cpu());
  CHECK(emptied.reserved_bytes == emptied.allocated_bytes);
  CHECK(emptied.allocated_bytes == base.allocated_bytes);
}

TEST_CASE("the CPU allocator keeps freed small blocks by size and empty_cache gives them back") {
  // Note [small CPU blocks] in core/allocator.cpp.
  memory::empty_cache(Device::cpu());
  const MemoryStats base = memory::stats(Device::cpu());
  auto reserved = [] { return memory::stats(Device::cpu()).reserved_bytes; };
  void* first = nullptr;
  {
    Tensor scalar_like = empty({16});  // 64 bytes
    first = scalar_like.data_ptr();
  }
#if !defined(__SANITIZE_ADDRESS__)  // the cache is off under AddressSanitizer
  CHECK(reserved() == base.reserved_bytes + 64);
  {
    Tensor again = empty({10});  // 40 bytes: a 64-byte block, the one just freed
    CHECK(again.data_ptr() == first);
    Tensor other = empty({17});  // 68 bytes: a 128-byte block, not that one
    CHECK(other.data_ptr() != first);
    CHECK(reinterpret_cast<uintptr_t>(other.data_ptr()) % 64 == 0);
  }
  CHECK(reserved() == base.reserved_bytes + 64 + 128);
  {
    std::vector<Tensor> many;  // 300 blocks of 64 bytes: 256 are kept when freed, 44 go back
    for (int i = 0; i < 300; ++i) many.push_back(empty({16}));
  }
  CHECK(reserved() == base.reserved_bytes + 256 * 64 + 128);
#endif
  CHECK(memory::stats(Device::cpu()).allocated_bytes == base.allocated_bytes);
  memory::empty_cache(Device::cpu());
  CHECK(reserved() == base.reserved_bytes);
}

TEST_CASE("the CPU allocator splits a cached block and merges the halves back") {
  memory::empty_cache(Device::cpu());
  const MemoryStats base = memory::stats(Device::cpu());
  auto reserved = [] { return memory::stats(Device::cpu()).reserved_bytes; };
  constexpr int64_t kMiB = 1 << 20, kFloatsPerMiB = 1 << 18;
  char* whole = nullptr;
  {
    Tensor two = empty({2 * kFloatsPerMiB});
    whole = static_cast<char*>(two.data_ptr());
  }
#if !defined(__SANITIZE_ADDRESS__)  // the cache is off under AddressSanitizer
  CHECK(reserved() == base.reserved_bytes + 2 * kMiB);
  {
    Tensor a = empty({kFloatsPerMiB}), b = empty({kFloatsPerMiB});  // both from the freed 2 MiB
    CHECK(static_cast<char*>(a.data_ptr()) == whole);
    CHECK(static_cast<char*>(b.data_ptr()) == whole + kMiB);
    CHECK(reserved() == base.reserved_bytes + 2 * kMiB);
  }
  {
    Tensor again = empty({2 * kFloatsPerMiB});  // the halves merged back into one block
    CHECK(static_cast<char*>(again.data_ptr()) == whole);
  }
  {
    // Nothing free fits 3 MiB: the wholly free 2 MiB segment goes back, one of 3 MiB comes.
    Tensor three = empty({3 * kFloatsPerMiB});
    CHECK(reserved() == base.reserved_bytes + 3 * kMiB);
    Tensor small = empty({kFloatsPerMiB / 2});  // `three` fills its segment: a new one of 512 KiB
    CHECK(reserved() == base.reserved_bytes + 3 * kMiB + kMiB / 2);
  }
  CHECK(reserved() == base.reserved_bytes + 3 * kMiB + kMiB / 2);
#endif
  memory::empty_cache(Device::cpu());
  CHECK(reserved() == memory::stats(Device::cpu()).allocated_bytes);
  CHECK(memory::stats(Device::cpu()).allocated_bytes == base.allocated_bytes);
}

TEST_CASE("printing matches PyTorch") {
  // Expected strings are PyTorch 1.13's repr() with torch. -> kiln. and grad_fn names without the
  // trailing 0.
  CHECK(tensor({{0.1, 0.2}}, TensorOptions().requires_grad(true)).str() == "tensor([[0.1000, 0.2000]], requires_grad=True)");
  CHECK(tensor({1, 2, 3}).str() == "tensor([1., 2., 3.])");
  CHECK(arange(1, 4).str() == "tensor([1, 2, 3])");
  CHECK(arange(1, 3).to(kInt32).str() == "tensor([1, 2], dtype=kiln.int32)");
  CHECK(from_vector(std::vector<bool>{true, false}).str() == "tensor([ True, False])");
  CHECK(full({}, 3.5).str() == "tensor(3.5000)");
  CHECK(tensor({1e-5, 1.0}).str() == "tensor([1.0000e-05, 1.0000e+00])");
  CHECK(zeros({0, 3}).str() == "tensor([], size=(0, 3))");
  CHECK(zeros({0}).str() == "tensor([])");
  CHECK(zeros({0}, kInt64).str() == "tensor([], dtype=kiln.int64)");  // empty: its dtype, bool's and int64's too
  CHECK(zeros({0, 3}, kBool).str() == "tensor([], size=(0, 3), dtype=kiln.bool)");
  CHECK(zeros({0}, kFloat64).str() == "tensor([], dtype=kiln.float64)");
  CHECK(arange(2000).str() == "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  CHECK(tensor({1.5, 2.0}, kFloat64).str() == "tensor([1.5000, 2.0000], dtype=kiln.float64)");
  CHECK((tensor({1.0}, TensorOptions().requires_grad(true)) * 2).str() == "tensor([2.], grad_fn=<MulBackward>)");
  CHECK((arange(12, kFloat32).view({3, 4}) / 7).str() ==
        "tensor([[0.0000, 0.1429, 0.2857, 0.4286],\n"
        "        [0.5714, 0.7143, 0.8571, 1.0000],\n"
        "        [1.1429, 1.2857, 1.4286, 1.5714]])");
  CHECK((arange(40, kFloat32) / 3).str() ==
        "tensor([ 0.0000,  0.3333,  0.6667,  1.0000,  1.3333,  1.6667,  2.0000,  2.3333,\n"
        "         2.6667,  3.0000,  3.3333,  3.6667,  4.0000,  4.3333,  4.6667,  5.0000,\n"
        "         5.3333,  5.6667,  6.0000,  6.3333,  6.6667,  7.0000,  7.3333,  7.6667,\n"
        "         8.0000,  8.3333,  8.6667,  9.0000,  9.3333,  9.6667, 10.0000, 10.3333,\n"
        "        10.6667, 11.0000, 11.3333, 11.6667, 12.0000, 12.3333, 12.6667, 13.0000])");
  CHECK(arange(3000, kFloat32).view({30, 100}).str() ==
        "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 9.7000e+01, 9.8000e+01,\n"
        "         9.9000e+01],\n"
        "        [1.0000e+02, 1.0100e+02, 1.0200e+02,  ..., 1.9700e+02, 1.9800e+02,\n"
        "         1.9900e+02],\n"
        "        [2.0000e+02, 2.0100e+02, 2.0200e+02,  ..., 2.9700e+02, 2.9800e+02,\n"
        "         2.9900e+02],\n"
        "        ...,\n"
        "        [2.7000e+03, 2.7010e+03, 2.7020e+03,  ..., 2.7970e+03, 2.7980e+03,\n"
        "         2.7990e+03],\n"
        "        [2.8000e+03, 2.8010e+03, 2.8020e+03,  ..., 2.8970e+03, 2.8980e+03,\n"
        "         2.8990e+03],\n"
        "        [2.9000e+03, 2.9010e+03, 2.9020e+03,  ..., 2.9970e+03, 2.9980e+03,\n"
        "         2.9990e+03]])");
  CHECK(tensor({NAN, INFINITY, -1.5}).str() == "tensor([    nan,     inf, -1.5000])");
  CHECK(tensor({1, 2}, kFloat16).str() == "tensor([1., 2.], dtype=kiln.float16)");
  CHECK(arange(24, kFloat32).view({2, 3, 4}).str() ==
        "tensor([[[ 0.,  1.,  2.,  3.],\n"
        "         [ 4.,  5.,  6.,  7.],\n"
        "         [ 8.,  9., 10., 11.]],\n"
        "\n"
        "        [[12., 13., 14., 15.],\n"
        "         [16., 17., 18., 19.],\n"
        "         [20., 21., 22., 23.]]])");
  std::ostringstream os;
  os << tensor({1, 2});
  CHECK(os.str() == "tensor([1., 2.])");
}

TEST_CASE("set_num_threads controls the pool and rejects nonsense") {
  set_num_threads(1);
  CHECK(get_num_threads() == 1);
  Tensor a = rand({300, 300});
  Tensor serial = matmul(a, a);
  set_num_threads(2);
  CHECK(get_num_threads() == 2);
  test::check_close(matmul(a, a), serial);
  test::check_error([] { set_num_threads(0); }, {"set_num_threads", "at least 1"});
}

TEST_CASE("kernel errors thrown on a worker thread reach the caller") {
  Tensor x = rand({200000});
  Tensor idx = zeros({200000}, kInt64);
  idx.narrow(0, 199999, 1).fill_(1000000);  // in the second half: the pool's second thread
  test::check_error([&] { x.gather(0, idx); }, {"gather", "index 1000000", "out of bounds", "size 200000"});
}

TEST_CASE("reductions give bit-identical results on 1 and 2 threads") {
  Tensor x = test::sample({3000, 64}), y = test::sample({64, 3000}, kFloat32, 1.0).t();
  auto run = [&] {
    return std::vector<Tensor>{x.sum({0}), x.sum({1}), x.sum(), y.sum({0}), y.amax({1}), x.mean({0}, true)};
  };
  set_num_threads(1);
  std::vector<Tensor> serial = run();
  set_num_threads(2);
  std::vector<Tensor> parallel = run();
  for (size_t i = 0; i < serial.size(); ++i) test::check_equal(parallel[i], serial[i]);
  test::check_close(x.sum({0}), x.to(kFloat64).sum({0}).to(kFloat32));
}

TEST_CASE("scalars convert into a dtype only where the value fits it, as PyTorch's checked conversions") {
  // A finite value past a floating dtype's largest is an Error (it became inf); inf and nan pass.
  test::check_error([] { full({2}, 1e10, kFloat16); }, {"the value 10000000000 cannot be converted to float16"});
  test::check_error([] { full({2}, 70000, kFloat16); }, {"70000", "float16"});
  test::check_error([] { full({2}, 1e300, kBFloat16); }, {"bfloat16"});
  test::check_error([] { full({2}, 1e300); }, {"float32"});
  test::check_error([] { zeros({2}, kFloat16).fill_(1e10); }, {"float16"});
  test::check_error([] { (void)full({}, 1e300, kFloat64).item<float>(); }, {"float32"});
  CHECK(std::isinf(full({1}, INFINITY, kFloat16).item<float>()));
  CHECK(std::isnan(full({1}, NAN, kBFloat16).item<float>()));
  CHECK(full({1}, 65504, kFloat16).item<float>() == 65504);
  CHECK(full({1}, -3.3895313892515355e38, kBFloat16).item<float>() == -3.3895313892515355e38f);
  // An integer past int64 is an Error where it wrapped to -1; to an integer type, the message
  // names that type (a NaN to int32 said int64).
  test::check_error([] { full({1}, std::numeric_limits<uint64_t>::max(), kInt64); },
                    {"18446744073709551615 is past int64's range"});
  CHECK(full({1}, uint64_t{1} << 62, kInt64).item<int64_t>() == int64_t{1} << 62);
  test::check_error([] { (void)full({}, -1, kInt64).item<uint64_t>(); }, {"-1 cannot be converted to uint64"});
  test::check_error([] { (void)full({}, NAN).item<int>(); }, {"nan cannot be converted to int32"});
  test::check_error([] { full({2}, 3e9, kInt32); }, {"3000000000 cannot be converted to int32"});
  CHECK(full({}, -2147483648.0).item<int>() == INT32_MIN);
  CHECK(full({}, 255.0).item<uint8_t>() == 255);
  test::check_error([] { (void)full({}, 256.0).item<uint8_t>(); }, {"256 cannot be converted to uint8"});
  test::check_error([] { full({2}, 256, kUInt8); }, {"256 cannot be converted to uint8"});
}

TEST_CASE("odd calls on tensors that were accepted: PyTorch's Errors") {
  // set_data gave a tensor that requires grad int64 data; backward and optimizer steps then passed
  // it by without a word.
  Tensor x = ones({2}).requires_grad_();
  test::check_error([&] { x.set_data(ones({2}, kInt64)); }, {"set_data", "requires grad", "not int64"});
  CHECK(x.dtype() == kFloat32);
  Tensor plain = ones({2});
  plain.set_data(ones({2}, kInt64));  // without requires_grad it may
  CHECK(plain.dtype() == kInt64);
  // pow_ to a negative power on integers gave zeros; pow refused it already.
  test::check_error([] { full({2}, 2, kInt64).pow_(-1); }, {"pow_: integers to negative integer powers"});
  // A 0-d tensor takes dims -1 and 0 only; transpose gives a view, not the tensor itself.
  Tensor s = full({}, 1.0);
  test::check_error([&] { s.transpose(1, 0); }, {"transpose", "dim 1 is out of range"});
  test::check_error([&] { s.squeeze(5); }, {"squeeze", "dim 5 is out of range"});
  Tensor t = s.transpose(0, -1);
  CHECK_FALSE(t.is_same(s));
  CHECK(t.data_ptr() == s.data_ptr());
  CHECK(s.squeeze(0).dim() == 0);
  // from_vector names itself for a negative or overflowing shape (it named `empty`).
  test::check_error([] { from_vector(std::vector<float>{1, 2}, {-1, -2}); }, {"from_vector: sizes must be non-negative"});
  test::check_error([] { from_vector(std::vector<float>{}, {int64_t{1} << 32, int64_t{1} << 32}); },
                    {"from_vector: shape", "more elements than fit in 64 bits"});
  if (!cuda::is_available()) {  // a raw cudaGetDevice message with a source path before
#ifdef KILN_WITH_CUDA
    test::check_error([] { cuda::CudaEvent().record(); }, {"CudaEvent::record: no CUDA device is available"});
#else
    test::check_error([] { cuda::CudaEvent().record(); }, {"Kiln was built without CUDA"});
#endif
  }
}
