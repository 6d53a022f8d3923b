// tests/core/test_cublas_loading.cpp: a build with CUDA opens cuBLAS only when a CUDA matmul needs
// it (Note [cuBLAS opened on first use] in cuda/check.h): merely loading it costs ~150 MiB of RSS.
#include <fstream>
#include <string>

#include "support.h"

using namespace kiln;

#ifdef KILN_WITH_CUDA
namespace kiln::cuda {
void* cublas_symbol(const char* name);  // cuda/cublas_loader.cpp
}

static bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(library) != std::string::npos) return true;
  return false;
}

TEST_CASE("CPU training does not load cuBLAS, a CUDA matmul's first call does") {
  // On a GPU machine an earlier test of this process may have run a CUDA matmul already; without
  // one, only linking cuBLAS into the program can have loaded it.
  const bool loaded_before = mapped("libcublas");
  if (!cuda::is_available()) CHECK_FALSE(loaded_before);
  Tensor w = randn({64, 64}, TensorOptions().requires_grad(true));
  Tensor loss = matmul(randn({32, 64}), w).relu().sum();
  loss.backward();
  CHECK(w.grad().defined());
  if (!loaded_before) CHECK_FALSE(mapped("libcublas"));

  // What KILN_CUBLAS(fn) does at a call site, here without a GPU: open the library, find fn.
  using StatusName = const char* (*)(int);
  auto status_name = reinterpret_cast<StatusName>(cuda::cublas_symbol("cublasGetStatusName"));
  CHECK(std::string(status_name(1)) == "CUBLAS_STATUS_NOT_INITIALIZED");  // cublasStatus_t 1
  CHECK(mapped("libcublas.so"));
  CHECK(cuda::cublas_symbol("cublasLtGetVersion") != nullptr);
  CHECK(mapped("libcublasLt.so"));
  test::check_error([] { (void)cuda::cublas_symbol("cublasNoSuchFunction"); },
                    {"has no function cublasNoSuchFunction", "install"});
}
#endif
