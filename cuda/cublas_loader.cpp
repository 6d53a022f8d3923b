// cuda/cublas_loader.cpp: cuBLAS and cuBLASLt, opened on first use (Note [cuBLAS opened on first use]
// in cuda/check.h).
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <string_view>

#include "cuda/check.h"

namespace kiln::cuda {
namespace {

void* open_library(const std::string& soname) {
  void* handle = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef KILN_CUDA_LIBRARY_DIR
  // The toolkit Kiln was built against, where the loader's search path does not reach it.
  if (handle == nullptr)
    handle = dlopen((std::string(KILN_CUDA_LIBRARY_DIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
  if (handle == nullptr) {
    const char* why = dlerror();
    KILN_FAIL("cuBLAS: cannot load {} ({}): install the CUDA toolkit's cuBLAS {}, or put the folder that "
              "holds it on LD_LIBRARY_PATH",
              soname, why != nullptr ? why : "no reason given", CUBLAS_VER_MAJOR);
  }
  return handle;
}

}  // namespace

void* cublas_symbol(const char* name) {
  static std::mutex mutex;
  static void* cublas = nullptr;
  static void* cublas_lt = nullptr;
  const bool lt = std::string_view(name).starts_with("cublasLt");
  std::lock_guard<std::mutex> lock(mutex);
  void*& library = lt ? cublas_lt : cublas;
  const std::string soname = std::string(lt ? "libcublasLt.so." : "libcublas.so.") + std::to_string(CUBLAS_VER_MAJOR);
  if (library == nullptr) library = open_library(soname);
  void* symbol = dlsym(library, name);
  if (symbol == nullptr)
    KILN_FAIL("cuBLAS: {} has no function {}: it is older than the cuBLAS {} Kiln was built against; "
              "install that version", soname, name, CUBLAS_VER_MAJOR);
  return symbol;
}

}  // namespace kiln::cuda
