// tests/install_consumer/main.cpp: a user's program: one include, one namespace, a gradient.
#include <kiln/kiln.h>

#include <cstdio>

int main() {
  using namespace kiln;
  Tensor x = tensor({1.0, 2.0, 3.0}).requires_grad_();
  Tensor y = (x * x).sum();
  y.backward();
  std::printf("%s\n", x.grad().str().c_str());
  return x.grad().to_vector<float>() == std::vector<float>{2, 4, 6} ? 0 : 1;
}
