// tests/cuda/test_cuda_pinned.cpp: pinned host memory and non-blocking copies (Note [pinned host
// memory] in cuda/host_allocator.cpp, Note [non_blocking copies] in cuda/copy.cpp): pin_memory and
// its statistics; non-blocking copies in both directions, converting or not, return while the stream
// is held and deliver the right values once it runs; a pinned block is not handed out again while a
// queued copy still reads it; a block written on one stream and read on another arrives as written.
//
// "Returns while the stream is held" is checked without timing: a StreamGate queues a host function
// that blocks the stream until the test releases it. A copy that waited for its stream would wait for
// the gate, which gives up after 20 s and records that it was not released: the test fails, it does
// not hang.
#ifdef KILN_WITH_CUDA  // the gate is a host function on a CUDA stream
#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>

#include "support.h"

using namespace kiln;

namespace {
const Device kGpu = Device::cuda(0);

class StreamGate {
 public:
  StreamGate() {
    auto stream = static_cast<cudaStream_t>(cuda::current_stream(0).handle());
    REQUIRE(cudaLaunchHostFunc(stream, &StreamGate::hold, this) == cudaSuccess);
  }
  ~StreamGate() {
    release();
    try {
      cuda::current_stream(0).synchronize();  // the host function must not outlive this
    } catch (const Error&) {  // a broken device: the test has failed already
    }
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  // After the stream has passed the gate: whether release() came before the 20 s ran out.
  bool released_in_time() {
    cuda::current_stream(0).synchronize();
    std::lock_guard<std::mutex> lock(mutex_);
    return in_time_;
  }

 private:
  static void CUDART_CB hold(void* self) {  // runs on CUDA's thread; must not call CUDA
    auto* gate = static_cast<StreamGate*>(self);
    std::unique_lock<std::mutex> lock(gate->mutex_);
    gate->in_time_ = gate->cv_.wait_for(lock, std::chrono::seconds(20), [gate] { return gate->open_; });
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
  bool in_time_ = false;
};

// False under KILN_CUDA_NO_CACHING (a compute-sanitizer run): every freed device buffer is then a
// cudaFree, which waits for the device, and so for a gate that only the waiting thread can open.
bool gates_usable() {
  const char* off = std::getenv("KILN_CUDA_NO_CACHING");
  if (off == nullptr || *off == '\0' || std::string(off) == "0") return true;
  WARN("KILN_CUDA_NO_CACHING is set: a freed buffer would wait for the gated stream; test skipped");
  return false;
}

// Makes the device and pinned caches hold free blocks of these sizes (bytes, all at once), so that no
// cudaMalloc or cudaHostAlloc, which may wait for the device, happens behind a gate.
void warm_caches(const std::vector<int64_t>& device_bytes, const std::vector<int64_t>& pinned_bytes) {
  std::vector<Tensor> held;
  for (int64_t n : device_bytes) held.push_back(empty({n}, TensorOptions(kBool).device(kGpu)));
  for (int64_t n : pinned_bytes) held.push_back(empty({n}, TensorOptions(kBool).pinned_memory(true)));
  cuda::synchronize(0);
}
// Runs `copies` once ungated (which loads its kernels, since lazy loading may wait for the device,
// and leaves the device and pinned caches holding blocks of its sizes, since a cudaMalloc or
// cudaHostAlloc may wait too), then again behind a gate, and returns the second run's tensors once
// the stream has passed the gate. Checks that `copies` returned while the stream was held.
std::vector<Tensor> run_gated(const std::function<std::vector<Tensor>()>& copies) {
  (void)copies();
  cuda::synchronize(0);
  StreamGate gate;
  std::vector<Tensor> got = copies();
  gate.release();
  CHECK(gate.released_in_time());
  return got;
}
}  // namespace

TEST_CASE("pin_memory: a pinned copy with the same values, counted in host_memory_stats", "[gpu][pinned]") {
  const MemoryStats before = cuda::host_memory_stats();
  {
    Tensor x = test::sample({1000});
    CHECK_FALSE(x.is_pinned());
    Tensor p = x.pin_memory();
    CHECK(p.is_pinned());
    CHECK(p.is_cpu());
    CHECK(p.data_ptr() != x.data_ptr());
    test::check_equal(p, x);
    CHECK(p.pin_memory().is_same(p));       // pinned already: itself
    CHECK(p.narrow(0, 10, 100).is_pinned());  // a view of pinned storage
    Tensor z = zeros({3, 5}, TensorOptions(kFloat16).pinned_memory(true));
    CHECK(z.is_pinned());
    test::check_equal(z, zeros({3, 5}, kFloat16));
    const MemoryStats now = cuda::host_memory_stats();
    CHECK(now.allocated_bytes == before.allocated_bytes + 4000 + 30);
    CHECK(now.reserved_bytes >= now.allocated_bytes);
    Tensor w = rand({7}, TensorOptions().requires_grad(true)).pin_memory();  // differentiable, as a copy
    w.sum().backward();
  }
  const MemoryStats after = cuda::host_memory_stats();
  CHECK(after.allocated_bytes == before.allocated_bytes);
  cuda::host_empty_cache();
  CHECK(cuda::host_memory_stats().reserved_bytes <= after.reserved_bytes);
  test::check_error([] { (void)zeros({2}, kGpu).pin_memory(); }, {"pin_memory", "only CPU tensors", "cuda:0"});
  test::check_error([] { (void)empty({2}, TensorOptions(kGpu).pinned_memory(true)); },
                    {"pinned_memory", "only CPU tensors", "cuda:0"});
}

TEST_CASE("pin_memory is differentiable: the gradient passes through", "[gpu][pinned]") {
  Tensor x = test::sample({6}).requires_grad_(true);
  Tensor p = x.pin_memory();
  CHECK(p.requires_grad());
  (p * p).sum().backward();
  test::check_close(x.grad(), test::sample({6}) * 2, {1e-6, 1e-7});
}

TEST_CASE("non-blocking host-to-device copies from pinned memory are queued, not waited for", "[gpu][pinned]") {
  if (!gates_usable()) return;
  constexpr int64_t n = 4097;  // 17 x 241
  Tensor host = test::sample({n}).pin_memory();
  Tensor broadcast_row = test::sample({1, 241}, kFloat32, 0.25).pin_memory();
  auto copies = [&] {
    Tensor same = host.to(kGpu, /*non_blocking=*/true);            // one cudaMemcpyAsync
    Tensor half = host.to(kGpu, kFloat16, /*non_blocking=*/true);  // transfer, then convert on the device
    Tensor strided = empty({241, 17}, kGpu).t();                   // a transposed destination
    strided.copy_(host.view({17, 241}), /*non_blocking=*/true);
    Tensor expanded = empty({17, 241}, kGpu);
    expanded.copy_(broadcast_row, /*non_blocking=*/true);  // a broadcast source: its one row moves
    return std::vector<Tensor>{same, half, strided, expanded};
  };
  const std::vector<Tensor> got = run_gated(copies);
  test::check_equal(got[0].cpu(), host);
  test::check_equal(got[1].cpu(), host.to(kFloat16));
  test::check_equal(got[2].cpu(), host.view({17, 241}));
  test::check_equal(got[3].cpu(), broadcast_row.expand({17, 241}));
}

TEST_CASE("non-blocking device-to-host copies land in pinned memory once the stream gets there", "[gpu][pinned]") {
  if (!gates_usable()) return;
  constexpr int64_t n = 4097;
  Tensor dev = test::sample({n}).to(kGpu);
  Tensor dev_half = dev.to(kFloat16);
  auto copies = [&] {
    Tensor doubled = (dev * 2).to(Device::cpu(), /*non_blocking=*/true);               // after a kernel
    Tensor widened = dev_half.to(Device::cpu(), kFloat32, /*non_blocking=*/true);      // converted on the device
    Tensor transposed = dev.view({17, 241}).t().to(Device::cpu(), /*non_blocking=*/true);  // gathered there
    return std::vector<Tensor>{doubled, widened, transposed};
  };
  const std::vector<Tensor> got = run_gated(copies);
  for (const Tensor& t : got) CHECK(t.is_pinned());
  test::check_equal(got[0], test::sample({n}) * 2);
  test::check_equal(got[1], test::sample({n}).to(kFloat16).to(kFloat32));
  test::check_equal(got[2], test::sample({n}).view({17, 241}).t());
}

TEST_CASE("a non-blocking copy_ into a CPU tensor from a CUDA tensor that requires grad is complete", "[gpu][pinned]") {
  Tensor dev = test::sample({4097}).to(kGpu).requires_grad_(true);
  Tensor pinned_dst = empty({4097}, TensorOptions().pinned_memory(true));
  pinned_dst.copy_(dev * 3, /*non_blocking=*/true);  // recorded: takes the blocking path to the host
  test::check_equal(pinned_dst, test::sample({4097}) * 3);
}

TEST_CASE("non_blocking from pageable memory or within one device is an ordinary copy", "[gpu][pinned]") {
  Tensor host = test::sample({1000});  // not pinned: the synchronous path
  Tensor dev = host.to(kGpu, /*non_blocking=*/true);
  test::check_equal(dev.cpu(), host);
  Tensor back = zeros({1000});
  back.copy_(dev, /*non_blocking=*/true);  // into pageable memory: synchronous too
  test::check_equal(back, host);
  CHECK_FALSE(back.is_pinned());
  test::check_equal(dev.to(kGpu, kFloat64, true).cpu(), host.to(kFloat64));
}

TEST_CASE("a pinned block is not handed out again while a queued copy still reads it", "[gpu][pinned]") {
  if (!gates_usable()) return;
  constexpr int64_t n = int64_t{1} << 22;  // 16 MiB of float32
  warm_caches({4 * n}, {4 * n, 4 * n});    // two cached pinned blocks of this size: A, then B
  Tensor dev;
  void* first = nullptr;
  {
    StreamGate gate;
    {
      Tensor ones_host = full({n}, 1.0, TensorOptions().pinned_memory(true));  // block A
      Tensor spacer = empty({n}, TensorOptions().pinned_memory(true));          // block B
      first = ones_host.data_ptr();
      dev = ones_host.to(kGpu, /*non_blocking=*/true);
      ones_host = Tensor();  // A goes back first (its copy waits behind the gate), then B
    }
    // An allocator that ignored the pending copy would hand out A, the first free block, here.
    Tensor twos_host = full({n}, 2.0, TensorOptions().pinned_memory(true));
    CHECK(twos_host.data_ptr() != first);
    gate.release();
    CHECK(gate.released_in_time());
  }
  CHECK(dev.sum().item<double>() == static_cast<double>(n));  // the ones arrived, not twos
  Tensor again = empty({n}, TensorOptions().pinned_memory(true));
  CHECK(again.data_ptr() == first);  // its copy has run: the cache hands A out again
}
TEST_CASE("a pinned block written from the device on one stream and copied back on another arrives as written",
          "[gpu][pinned]") {
  // As SaveOnCpu(pin_memory) does when forward runs on a side stream and backward on the default one:
  // the copy back waits for the first copy's event (wait_host_uses). The side stream is held by a gate,
  // so a copy back that did not wait would read the zeros the block held before.
  if (!gates_usable()) return;
  constexpr int64_t n = 4097;
  warm_caches({4 * n}, {});  // the copy back's device buffer, without a cudaMalloc behind the gate
  Tensor dev = test::sample({n}).to(kGpu);
  Tensor host = zeros({n}, TensorOptions().pinned_memory(true));
  const cuda::CudaStream side(0);
  Tensor back;
  {
    cuda::StreamGuard on_side(side);
    StreamGate gate;                          // holds the side stream (current here)
    host.copy_(dev, /*non_blocking=*/true);  // device -> host, queued on the side stream
    {
      cuda::StreamGuard on_default(cuda::CudaStream::default_stream(0));
      back = host.to(kGpu, /*non_blocking=*/true);  // host -> device on the default stream
    }
    gate.release();
    CHECK(gate.released_in_time());
  }
  test::check_equal(back.cpu(), test::sample({n}));
}
#endif  // KILN_WITH_CUDA
