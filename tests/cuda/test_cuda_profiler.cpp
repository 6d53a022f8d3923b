// tests/cuda/test_cuda_profiler.cpp: cuda::KernelProfiler (cuda/profiler.h) on a GPU: it records the
// kernels and copies run between start() and stop(), grouped by name with their counts and GPU
// times, nothing before start() or after stop(); a second profile starts afresh; its misuse is an Error.
#include <algorithm>
#include <numeric>

#include "support.h"

using namespace kiln;

namespace {
const Device kGpu = Device::cuda(0);

const cuda::KernelTime* named(const std::vector<cuda::KernelTime>& ks, const std::string& name) {
  auto it = std::find_if(ks.begin(), ks.end(), [&](const cuda::KernelTime& k) { return k.name == name; });
  return it == ks.end() ? nullptr : &*it;
}
}  // namespace

TEST_CASE("KernelProfiler records the kernels and copies between start and stop, with GPU times", "[gpu][profiler]") {
  Tensor host = test::sample({1 << 20});
  Tensor a = host.to(kGpu), sum;
  sum = a + a;  // before start(): not recorded
  cuda::KernelProfiler prof;
  prof.start();
  Tensor b = host.to(kGpu);                     // one copy to the device
  for (int i = 0; i < 3; ++i) sum = a * b;      // three launches of one kernel
  Tensor back = sum.cpu();                      // one copy to the host
  prof.stop();
  sum = a - b;  // after stop(): not recorded
  const auto ks = prof.kernels();
  INFO(prof.table());
  const cuda::KernelTime* h2d = named(ks, "[memcpy HtoD]");
  const cuda::KernelTime* d2h = named(ks, "[memcpy DtoH]");
  REQUIRE(h2d != nullptr);
  REQUIRE(d2h != nullptr);
  CHECK(h2d->calls == 1);
  CHECK(d2h->calls == 1);
  // The multiply's kernel: three calls. Nothing else ran three times.
  const int64_t three = std::count_if(ks.begin(), ks.end(), [](const cuda::KernelTime& k) { return k.calls == 3; });
  CHECK(three == 1);
  const int64_t calls = std::accumulate(ks.begin(), ks.end(), int64_t{0},
                                        [](int64_t n, const cuda::KernelTime& k) { return n + k.calls; });
  CHECK(calls == 5);  // the add before start() and the subtract after stop() are not in it
  for (const auto& k : ks) {
    INFO(k.name);
    CHECK(k.total_ms > 0);
    CHECK(k.total_ms < 1000);
  }
  CHECK(std::is_sorted(ks.begin(), ks.end(), [](const auto& x, const auto& y) { return x.total_ms > y.total_ms; }));
  const double total = std::accumulate(ks.begin(), ks.end(), 0.0, [](double t, const auto& k) { return t + k.total_ms; });
  CHECK(prof.total_ms() == Approx(total));
  CHECK(prof.table().find(ks[0].name.substr(0, 40)) != std::string::npos);

  // A second profile starts afresh.
  prof.start();
  sum = a * b;
  prof.stop();
  const auto again = prof.kernels();
  REQUIRE(again.size() == 1);
  CHECK(again[0].calls == 1);

  // Misuse.
  prof.start();
  test::check_error([&] { prof.start(); }, {"KernelProfiler::start", "already started"});
  test::check_error([&] { (void)prof.kernels(); }, {"still running"});
  test::check_error([] { cuda::KernelProfiler other; }, {"another profiler exists"});
  prof.stop();
  test::check_error([&] { prof.stop(); }, {"KernelProfiler::stop", "not started"});
}
