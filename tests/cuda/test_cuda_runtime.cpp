// tests/cuda/test_cuda_runtime.cpp: the runtime API of cuda/cuda.h on a GPU: device properties,
// streams (a StreamGuard sends ops to its stream; wait_stream orders two streams), events (query,
// synchronize, timing), and the allocator over repeated training steps.
#include "support.h"

using namespace kiln;

namespace {
const Device kGpu = Device::cuda(0);
}

TEST_CASE("device properties describe the GPU", "[gpu]") {
  cuda::DeviceProperties p = cuda::get_device_properties(0);
  CHECK_FALSE(p.name.empty());
  CHECK(p.major >= 3);
  CHECK(p.multiprocessor_count > 0);
  CHECK(p.total_memory > (int64_t{1} << 30));
  test::check_error([] { cuda::get_device_properties(cuda::device_count()); }, {"get_device_properties", "does not exist"});
}

TEST_CASE("a StreamGuard sends ops to its stream, and wait_stream orders two streams", "[gpu]") {
  cuda::CudaStream side(0);
  CHECK(cuda::current_stream(0) == cuda::CudaStream::default_stream(0));
  CHECK(side != cuda::CudaStream::default_stream(0));
  Tensor x = test::sample({1 << 20}).to(kGpu);
  Tensor y;
  side.wait_stream(cuda::current_stream(0));  // x was made on the default stream
  {
    cuda::StreamGuard guard(side);
    CHECK(cuda::current_stream(0) == side);
    Tensor w = test::sample({512, 512}).to(kGpu);  // copies and kernels queue on `side`
    for (int i = 0; i < 10; ++i) w = matmul(w, w) * 0.01;
    y = x * 2 + w.sum();
  }
  CHECK(cuda::current_stream(0) == cuda::CudaStream::default_stream(0));
  cuda::current_stream(0).wait_stream(side);  // the default stream's later work sees y
  Tensor expected_w = test::sample({512, 512});
  for (int i = 0; i < 10; ++i) expected_w = matmul(expected_w, expected_w) * 0.01;
  test::check_close(y.cpu(), test::sample({1 << 20}) * 2 + expected_w.sum(), {1e-4, 1e-5});
  side.synchronize();
  CHECK(side.query());
}

TEST_CASE("events complete, synchronize and time the work between them", "[gpu]") {
  cuda::CudaEvent start(/*enable_timing=*/true), end(/*enable_timing=*/true);
  CHECK(start.query());  // never recorded
  Tensor a = rand({2048, 2048}, kGpu);
  start.record();
  for (int i = 0; i < 5; ++i) a = matmul(a, a) * (1.0 / 2048);
  end.record();
  end.synchronize();
  CHECK(end.query());
  CHECK(start.elapsed_time(end) > 0);
  cuda::CudaEvent untimed;
  untimed.record();
  test::check_error([&] { (void)untimed.elapsed_time(end); }, {"elapsed_time", "enable_timing"});
  cuda::CudaEvent unrecorded(true);
  test::check_error([&] { (void)start.elapsed_time(unrecorded); }, {"elapsed_time", "recorded"});
}

TEST_CASE("the allocator holds steady over training steps and returns to baseline", "[gpu]") {
  const MemoryStats base = memory::stats(kGpu);
  int64_t reserved_after_warmup = 0;
  {
    nn::Sequential net(nn::Linear(256, 512), nn::ReLU(), nn::Linear(512, 10));
    net.to(kGpu);
    optim::AdamW opt(net.parameters(), {.lr = 1e-3});
    Tensor x = randn({64, 256}, kGpu), target = randint(0, 10, {64}, TensorOptions(kInt64).device(kGpu));
    for (int step = 0; step < 12; ++step) {
      opt.zero_grad();
      Tensor loss = nn::cross_entropy(net.forward(x), target);
      loss.backward();
      opt.step();
      if (step == 2) reserved_after_warmup = memory::stats(kGpu).reserved_bytes;
    }
    CHECK(memory::stats(kGpu).reserved_bytes == reserved_after_warmup);  // no growth once warm
  }
  CHECK(memory::stats(kGpu).allocated_bytes == base.allocated_bytes);  // model, optimizer state, all freed
  memory::empty_cache(kGpu);
  CHECK(memory::stats(kGpu).reserved_bytes <= base.reserved_bytes);
}
