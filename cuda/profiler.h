// cuda/profiler.h: the GPU's own account of where a run's time went. KernelProfiler records every
// kernel, copy and memset the device runs between start() and stop(), with its duration on the GPU,
// through CUPTI's activity API (the library under torch.profiler's CUDA times and Nsight Systems):
// Kiln's own kernels, cuBLAS's, cuDNN's and NCCL's alike. Host-side timing of a step says how long
// it took; this says which kernels took it, so that two runs (Kiln's and PyTorch's, say) can be
// compared kernel by kernel.
//
//   cuda::KernelProfiler prof;
//   prof.start();
//   train_step();
//   prof.stop();                       // waits for the GPU, then collects the records
//   std::cout << prof.table(20);       // the 20 kernels with the most GPU time
//
// libcupti is opened when the first profiler is made (it ships with the CUDA toolkit, and with
// PyTorch as its nvidia-cuda-cupti wheel); without a GPU, or without CUPTI, the constructor is an
// Error saying what is missing. CUPTI's activity buffers are the process's: one profiler at a time,
// and no other CUPTI client (torch.profiler's Kineto, Nsight Systems) in the same process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::cuda {

// One kernel's (or copy's, or memset's) totals over a profile.
struct KernelTime {
  std::string name;  // the demangled kernel name without its parameters; "[memcpy HtoD]", "[memset]"
  int64_t calls = 0;
  double total_ms = 0;  // summed GPU durations (kernels on several streams may overlap)
};

class KernelProfiler {
 public:
  KernelProfiler();
  ~KernelProfiler();
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;

  // Waits for the devices in use (what ran before is not counted), drops what an earlier profile
  // recorded, and records from now on.
  void start();
  // Waits for the devices in use, then stops recording and collects what was recorded; an Error if
  // some of CUPTI's records could not be read (the profile would be short).
  void stop();
  // The recorded kernels grouped by name, the most GPU time first.
  std::vector<KernelTime> kernels() const;
  double total_ms() const;  // over all of them
  // kernels() as text: calls, total and mean time, and share of the total, for the first `top`.
  std::string table(size_t top = 25) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cuda
