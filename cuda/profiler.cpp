// cuda/profiler.cpp: KernelProfiler (cuda/profiler.h) on CUPTI's activity API, opened with dlopen
// like cuBLAS (Note [cuBLAS opened on first use] in cuda/check.h), so that Kiln neither links CUPTI
// nor needs it to run. Built without CUDA, or where CMake found no cupti.h, the constructor is an
// Error.
//
// How CUPTI hands the records over: once the kinds are enabled (concurrent kernels, which does not
// serialize them as the plain kernel kind would; copies; memsets), CUPTI asks for buffers through
// buffer_requested, fills them with one record per kernel as the GPU finishes it, and hands each full
// buffer (or, at stop()'s forced flush, each partly filled one) to buffer_completed, possibly on a
// thread of its own. The records are added to the running profiler's totals there, under a mutex.
#include "cuda/profiler.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>

#include "core/error.h"
#include "cuda/cuda.h"

#ifdef KILN_HAVE_CUPTI
#include <cupti.h>

#include "cuda/context.h"
#endif

namespace kiln::cuda {

namespace {

// What a profiler has recorded: its totals by name, and whether it is recording.
struct Records {
  std::map<std::string, KernelTime> totals;
  bool running = false;
  uint64_t lost = 0;  // buffers whose records could not all be kept
};

}  // namespace

struct KernelProfiler::Impl : Records {};

namespace {

#ifdef KILN_HAVE_CUPTI

std::mutex g_mutex;
Records* g_active = nullptr;  // the profiler that exists, receiving the records

// "void kiln::cuda::(anonymous namespace)::k<float, 32>(float const*, long)" -> "kiln::cuda::k<float, 32>".
std::string short_name(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  for (const std::string_view noise : {std::string_view("(anonymous namespace)::"), std::string_view("void ")}) {
    for (size_t at = name.find(noise); at != std::string::npos; at = name.find(noise)) name.erase(at, noise.size());
  }
  int depth = 0;  // of template brackets: a '(' outside them opens the parameter list
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '<') ++depth;
    if (name[i] == '>') --depth;
    if (name[i] == '(' && depth == 0 && i > 0) return name.substr(0, i);
  }
  return name;
}

void add_record(const std::string& name, uint64_t start_ns, uint64_t end_ns) {
  if (!g_active || !g_active->running) return;
  KernelTime& k = g_active->totals[name];
  if (k.name.empty()) k.name = name;
  ++k.calls;
  k.total_ms += end_ns > start_ns ? static_cast<double>(end_ns - start_ns) * 1e-6 : 0.0;
}

// The CUPTI functions Kiln calls, looked up in libcupti once.
struct Cupti {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

template <typename F>
void find(void* library, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(library, name));
  KILN_CHECK(f != nullptr, "KernelProfiler: libcupti has no {}: it is older than the CUPTI {} Kiln was built "
             "against; put a newer one on LD_LIBRARY_PATH", name, CUPTI_API_VERSION);
}

const Cupti& cupti() {
  static const Cupti functions = [] {
    void* library = nullptr;
    std::string tried;
#ifdef KILN_CUPTI_LIBRARY
    library = dlopen(KILN_CUPTI_LIBRARY, RTLD_NOW | RTLD_LOCAL);  // the one CMake found at build time
    if (!library) tried = KILN_CUPTI_LIBRARY;
#endif
    for (const std::string& soname : {std::string("libcupti.so.") + std::to_string(CUDA_VERSION / 1000),
                                      std::string("libcupti.so")}) {
      if (library) break;
      library = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef KILN_CUDA_LIBRARY_DIR
      if (!library) library = dlopen((std::string(KILN_CUDA_LIBRARY_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
      if (library) break;
      tried += (tried.empty() ? "" : ", ") + soname;
    }
    KILN_CHECK(library != nullptr,
               "KernelProfiler: cannot load CUPTI (tried {}): it ships with the CUDA toolkit (extras/CUPTI/lib64, "
               "or lib) and with PyTorch (the nvidia-cuda-cupti wheel); put the folder that holds libcupti.so "
               "on LD_LIBRARY_PATH",
               tried);
    Cupti c;
    find(library, "cuptiActivityRegisterCallbacks", c.register_callbacks);
    find(library, "cuptiActivityEnable", c.enable);
    find(library, "cuptiActivityDisable", c.disable);
    find(library, "cuptiActivityFlushAll", c.flush_all);
    find(library, "cuptiActivityGetNextRecord", c.next_record);
    find(library, "cuptiGetResultString", c.result_string);
    return c;
  }();
  return functions;
}

void check(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return;
  const char* what = nullptr;
  cupti().result_string(result, &what);
  KILN_FAIL("KernelProfiler: {} failed: {} (CUPTI error {})", call, what ? what : "no description",
            static_cast<int>(result));
}

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;  // no buffer: CUPTI drops the records and counts them
  *max_records = 0;                    // as many as fit
}

std::string copy_name(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[memcpy HtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[memcpy DtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[memcpy DtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[memcpy PtoP]";
    default: return "[memcpy]";
  }
}

// CUPTI calls this from its own threads, through C: nothing may escape it (a failed allocation
// while the records are read loses the rest of the buffer, which stop() reports).
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  try {
    CUpti_Activity* record = nullptr;
    while (cupti().next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          add_record(k->name ? short_name(k->name) : std::string("[unnamed kernel]"), k->start, k->end);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          add_record(copy_name(m->copyKind), m->start, m->end);
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
          add_record("[memset]", m->start, m->end);
          break;
        }
        default: break;
      }
    }
  } catch (...) {
    if (g_active) ++g_active->lost;
  }
  std::free(buffer);
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

#endif  // KILN_HAVE_CUPTI

}  // namespace

KernelProfiler::KernelProfiler() : impl_(std::make_unique<Impl>()) {
  KILN_CHECK(is_available(), "KernelProfiler: no CUDA device is available (or Kiln was built without CUDA); it "
             "profiles the kernels a GPU runs");
#ifdef KILN_HAVE_CUPTI
  cupti();  // an Error here if libcupti cannot be opened
  std::lock_guard<std::mutex> lock(g_mutex);
  KILN_CHECK(g_active == nullptr,
             "KernelProfiler: another profiler exists; CUPTI's activity records are the process's, so make "
             "one at a time (and stop and drop the first)");
  static const bool registered = [] {
    check(cupti().register_callbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
    return true;
  }();
  (void)registered;
  g_active = impl_.get();
#else
  KILN_FAIL("KernelProfiler: Kiln was built without CUPTI's header (cupti.h, in the CUDA toolkit's include "
            "or extras/CUPTI/include); reconfigure with a toolkit that has it");
#endif
}

KernelProfiler::~KernelProfiler() {
#ifdef KILN_HAVE_CUPTI
  if (impl_->running) {
    try {
      stop();
    } catch (...) {  // a destructor does not throw: the records are dropped with the profiler
    }
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_active == impl_.get()) g_active = nullptr;
#endif
}

void KernelProfiler::start() {
#ifdef KILN_HAVE_CUPTI
  KILN_CHECK(!impl_->running, "KernelProfiler::start: already started; call stop() first");
  for (int d : devices_in_use()) synchronize(d);  // what ran before is not counted
  // Records still buffered (a profiler whose stop() failed before it disabled them) are delivered
  // now, while no profile runs, and dropped.
  check(cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    impl_->totals.clear();
    impl_->lost = 0;
    impl_->running = true;
  }
  for (CUpti_ActivityKind kind : kKinds) check(cupti().enable(kind), "cuptiActivityEnable");
#endif
}

void KernelProfiler::stop() {
#ifdef KILN_HAVE_CUPTI
  KILN_CHECK(impl_->running, "KernelProfiler::stop: not started; call start() first");
  for (int d : devices_in_use()) synchronize(d);
  // Disabled first, then flushed: a record made between the two is still delivered.
  for (CUpti_ActivityKind kind : kKinds) check(cupti().disable(kind), "cuptiActivityDisable");
  check(cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(g_mutex);
  impl_->running = false;
  KILN_CHECK(impl_->lost == 0, "KernelProfiler::stop: {} buffers of CUPTI's records could not be read (out of "
             "host memory?); the profile is incomplete, so profile a shorter run", impl_->lost);
#endif
}

std::vector<KernelTime> KernelProfiler::kernels() const {
  KILN_CHECK(!impl_->running, "KernelProfiler: the profile is still running; call stop() first");
  std::vector<KernelTime> out;
  for (const auto& [name, k] : impl_->totals) out.push_back(k);
  std::stable_sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) { return a.total_ms > b.total_ms; });
  return out;
}

double KernelProfiler::total_ms() const {
  double total = 0;
  for (const KernelTime& k : kernels()) total += k.total_ms;
  return total;
}

std::string KernelProfiler::table(size_t top) const {
  const std::vector<KernelTime> all = kernels();
  const double total = total_ms();
  std::string out = fmt::format("{:>10} {:>7} {:>10} {:>6}  {}\n", "total ms", "calls", "mean us", "share", "kernel");
  for (size_t i = 0; i < all.size() && i < top; ++i) {
    const KernelTime& k = all[i];
    std::string name = k.name.size() > 110 ? k.name.substr(0, 107) + "..." : k.name;
    out += fmt::format("{:>10.3f} {:>7} {:>10.2f} {:>5.1f}%  {}\n", k.total_ms, k.calls,
                       1e3 * k.total_ms / static_cast<double>(std::max<int64_t>(k.calls, 1)),
                       total > 0 ? 100 * k.total_ms / total : 0.0, name);
  }
  out += fmt::format("{:>10.3f} {:>7}  (all {} kernels)\n", total, "", all.size());
  return out;
}

}  // namespace kiln::cuda
