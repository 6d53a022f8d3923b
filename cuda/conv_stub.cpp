// cuda/conv_stub.cpp: conv.cu's launchers when Kiln is built with CUDA but without cuDNN (see
// cuda/CMakeLists.txt): convolution on a CUDA tensor is an Error saying what to install. Pooling and
// normalisation (pool.cu, norm.cu) need no cuDNN and are built either way.
#include "cuda/kernels.h"

namespace kiln::cuda {
namespace {

[[noreturn]] void no_cudnn(const char* op) {
  KILN_FAIL("{}: Kiln was built without cuDNN, which convolution on CUDA needs; install cuDNN 9 and "
            "reconfigure (-DCUDNN_ROOT=... if it is outside the CUDA toolkit), or run the "
            "convolution on the CPU",
            op);
}

}  // namespace

void conv2d_launch(const View&, const View&, const View&, const View&, const ConvArgs&, int,
                   const Stream&) {
  no_cudnn("conv2d");
}
void conv2d_backward_input_launch(const View&, const View&, const View&, const ConvArgs&, int,
                                  const Stream&) {
  no_cudnn("conv2d_backward_input");
}
void conv2d_backward_weight_launch(const View&, const View&, const View&, const ConvArgs&, int,
                                   const Stream&) {
  no_cudnn("conv2d_backward_weight");
}

}  // namespace kiln::cuda
