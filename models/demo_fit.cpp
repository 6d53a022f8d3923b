// models/demo_fit.cpp: kiln-demo, a first look at Kiln: fit a two-layer network to y = sin(3x) on
// [-1, 1] with plain gradient descent, using only tensors and autograd, and watch the loss fall.
// Exits non-zero if the final loss is not at least 10x below the first (the README demo test).
#include <kiln/kiln.h>

#include <cstdio>
#include <cstring>

using namespace kiln;

namespace {

// The fit itself; main() below reads the arguments and reports an Error (a bad KILN_* setting).
int fit() {
  manual_seed(0);
  const int64_t N = 256, H = 32;               // N samples, H hidden units
  Tensor x = linspace(-1, 1, N).unsqueeze(1);  // (N, 1)
  Tensor y = (x * 3).sin();                    // (N, 1)

  // Parameters: leaves that require grad.
  Tensor w1 = (randn({1, H}) * 1.0).requires_grad_();  // (1, H)
  Tensor b1 = zeros({H}).requires_grad_();             // (H)
  Tensor w2 = (randn({H, 1}) * 0.2).requires_grad_();  // (H, 1)
  Tensor b2 = zeros({1}).requires_grad_();             // (1)
  const double lr = 0.1;

  double first = 0, last = 0;
  for (int step = 0; step <= 2000; ++step) {
    Tensor h = tanh(matmul(x, w1) + b1);       // (N, H)
    Tensor pred = matmul(h, w2) + b2;          // (N, 1)
    Tensor loss = (pred - y).square().mean();  // ()
    loss.backward();
    {
      NoGradGuard no_grad;  // the update itself is not part of the graph
      for (Tensor* p : {&w1, &b1, &w2, &b2}) {
        p->sub_(p->grad(), lr);
        p->grad().zero_();
      }
    }
    last = loss.item<double>();
    if (step == 0) first = last;
    if (step % 250 == 0) std::printf("step %4d  loss %.6f\n", step, last);
  }
  std::printf("loss fell from %.4f to %.6f (%.0fx)\n", first, last, first / last);
  return last * 10 < first ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    const bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
    if (!help) {
      std::fprintf(stderr, "kiln-demo: error: unknown argument '%s'; kiln-demo takes none (see --help)\n", argv[1]);
      return 2;
    }
    std::puts("usage: kiln-demo\nFits a two-layer network to y = sin(3x) on [-1, 1] with tensors and autograd "
              "alone and prints the loss as it falls; exits 1 unless it falls 10x.");
    return 0;
  }
  try {
    return fit();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-demo: error: %s\n", e.what());
    return 2;
  }
}
