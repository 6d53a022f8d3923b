// tests/cuda/test_cuda_allocator.cpp: the caching allocator (Note [CUDA caching allocator] in
// cuda/allocator.cpp): reuse without cudaMalloc, splitting and merging inside a segment, the
// statistics, empty_cache, and record_stream holding a block back until the other stream is done.
#ifdef KILN_WITH_CUDA  // the test drives a CUDA stream of its own
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "cuda/context.h"
#include "support.h"

using namespace kiln;

namespace {
const Device kGpu = Device::cuda(0);

// False under KILN_CUDA_NO_CACHING (a compute-sanitizer run): then nothing is cached to test.
bool caching() {
  const char* off = std::getenv("KILN_CUDA_NO_CACHING");
  if (off == nullptr || *off == '\0' || std::string(off) == "0") return true;
  WARN("KILN_CUDA_NO_CACHING is set: the cache is off, nothing to test");
  return false;
}
}  // namespace

TEST_CASE("caching allocator: a freed block is reused, and stats count tensors and segments", "[gpu]") {
  if (!caching()) return;
  memory::empty_cache(kGpu);
  const MemoryStats base = memory::stats(kGpu);
  void* first = nullptr;
  {
    Tensor t = empty({1 << 18}, kGpu);  // 1 MiB: a small block, from a 2 MiB segment
    first = t.data_ptr();
    const MemoryStats s = memory::stats(kGpu);
    CHECK(s.allocated_bytes == base.allocated_bytes + (1 << 20));
    CHECK(s.reserved_bytes == base.reserved_bytes + (2 << 20));
  }
  const MemoryStats after = memory::stats(kGpu);
  CHECK(after.allocated_bytes == base.allocated_bytes);
  CHECK(after.reserved_bytes == base.reserved_bytes + (2 << 20));  // kept
  {
    Tensor t = empty({1 << 18}, kGpu);
    CHECK(t.data_ptr() == first);
    CHECK(memory::stats(kGpu).reserved_bytes == after.reserved_bytes);  // no new segment
  }
  memory::empty_cache(kGpu);
  CHECK(memory::stats(kGpu).reserved_bytes == base.reserved_bytes);
}

TEST_CASE("caching allocator: running out of device memory is an OutOfMemoryError with the figures", "[gpu]") {
  const MemoryStats base = memory::stats(kGpu);
  const Shape huge{int64_t{1} << 45};  // 2^47 bytes: more than any GPU holds
  CHECK_THROWS_AS(empty(huge, kGpu), OutOfMemoryError);
  test::check_error([&] { (void)empty(huge, kGpu); },
                    {"CUDA out of memory on cuda:0: could not allocate 140737488355328 bytes", "MiB free of"});
  CHECK(memory::stats(kGpu).allocated_bytes == base.allocated_bytes);
  CHECK(ones({3}, kGpu).sum().item<float>() == 3.0f);  // and the device still works
}

TEST_CASE("caching allocator: blocks split from a segment merge back when freed", "[gpu]") {
  if (!caching()) return;
  memory::empty_cache(kGpu);
  const MemoryStats base = memory::stats(kGpu);
  void* start = nullptr;
  {
    // 4 MiB each: large requests under 10 MiB, split from one 20 MiB segment, one after the other.
    Tensor a = empty({1 << 20}, kGpu), b = empty({1 << 20}, kGpu);
    start = a.data_ptr();
    CHECK(static_cast<char*>(b.data_ptr()) == static_cast<char*>(start) + (4 << 20));
    CHECK(memory::stats(kGpu).reserved_bytes == base.reserved_bytes + (20 << 20));
  }
  {
    // Freed, both blocks and the rest merged into the whole 20 MiB again: an 18 MiB request fits
    // at its start (unmerged, the largest free piece would be 12 MiB and a new segment needed).
    Tensor big = empty({9 << 19}, kGpu);
    CHECK(big.data_ptr() == start);
    CHECK(memory::stats(kGpu).reserved_bytes == base.reserved_bytes + (20 << 20));
  }
  memory::empty_cache(kGpu);
  CHECK(memory::stats(kGpu).reserved_bytes == base.reserved_bytes);
}

TEST_CASE("caching allocator: values survive reuse by later kernels on the same stream", "[gpu]") {
  // Results computed from temporaries that are freed and reused within one expression chain.
  Tensor x = arange(0, 100000, 1, kFloat32).to(kGpu);
  Tensor y = x;
  for (int i = 0; i < 50; ++i) y = (y + 1) * 1;  // each step frees the previous temporary
  test::check_equal(y.cpu(), arange(0, 100000, 1, kFloat32) + 50);
}

TEST_CASE("caching allocator: record_stream keeps a block until the other stream is done", "[gpu]") {
  if (!caching()) return;
  cudaStream_t side = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  static std::atomic<bool> release{false};
  release = false;
  // A host function on `side` that waits for the test: `side` stays busy until it returns.
  REQUIRE(cudaLaunchHostFunc(
              side, [](void*) { while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1)); },
              nullptr) == cudaSuccess);
  void* p = nullptr;
  {
    Tensor t = empty({1 << 16}, kGpu);
    p = t.data_ptr();
    cuda::record_stream(0, p, side);
  }
  {
    Tensor u = empty({1 << 16}, kGpu);
    CHECK(u.data_ptr() != p);  // held back: `side` may still use it
  }
  release = true;
  REQUIRE(cudaStreamSynchronize(side) == cudaSuccess);
  {
    Tensor w = empty({1 << 16}, kGpu);
    CHECK(w.data_ptr() == p);  // free again once `side` is past the point of the free
  }
  test::check_error([] { cuda::record_stream(0, reinterpret_cast<void*>(0x10), nullptr); }, {"record_stream", "not the start"});
  REQUIRE(cudaStreamDestroy(side) == cudaSuccess);
}

#endif  // KILN_WITH_CUDA
