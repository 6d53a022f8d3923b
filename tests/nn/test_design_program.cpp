// tests/nn/test_design_program.cpp: the user program of DESIGN.md §2, its model written exactly as there,
// trained a few steps on a small batch of random images (plain SGD here: the optimizers live in optim/);
// the loss must fall.
#include "nn_golden.h"

using namespace kiln;

namespace {

// Verbatim from DESIGN.md §2.
struct Net : nn::Module {
  nn::Conv2d c1{1, 32, 3, {.padding = 1}};  nn::Conv2d c2{32, 64, 3, {.padding = 1}};
  nn::Linear f1{64 * 7 * 7, 128};           nn::Linear f2{128, 10};
  Net() { register_modules({{"c1", c1}, {"c2", c2}, {"f1", f1}, {"f2", f2}}); }
  Tensor forward(const Tensor& x) {
    auto h = max_pool2d(relu(c1(x)), 2);  h = max_pool2d(relu(c2(h)), 2);
    return f2(relu(f1(h.flatten(1))));
  }
};

}  // namespace

TEST_CASE("The DESIGN.md §2 model trains and its loss falls", "[nn][design]") {
  Device dev = cuda::is_available() ? Device::cuda(0) : Device::cpu();
  manual_seed(0);
  Net net;  net.to(dev);
  CHECK(net.parameters().size() == 8);
  CHECK(net.state_dict().keys() == std::vector<std::string>{"c1.weight", "c1.bias", "c2.weight", "c2.bias",
                                                            "f1.weight", "f1.bias", "f2.weight", "f2.bias"});
  // Hooks see c1(x): it is called through them.
  int c1_calls = 0;
  auto handle = net.c1.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& y) {
    CHECK(y.sizes() == Shape{8, 32, 28, 28});
    ++c1_calls;
    return Tensor();
  });
  Tensor x = randn({8, 1, 28, 28}).to(dev);
  Tensor y = randint(0, 10, {8}).to(dev);
  std::vector<Tensor> params = net.parameters();  // built after to(), as PyTorch's optimizers
  std::vector<double> losses;
  for (int step = 0; step < 15; ++step) {
    Tensor loss = nn::cross_entropy(net.forward(x), y);
    net.zero_grad();
    loss.backward();
    {
      NoGradGuard no_grad;
      for (Tensor& p : params) p.sub_(p.grad(), 0.03);  // SGD
    }
    losses.push_back(loss.item<double>());
  }
  CHECK(c1_calls == 15);
  handle.remove();
  INFO("losses " << ::Catch::Detail::stringify(losses));
  CHECK(losses.front() > 1.5);           // about log(10) at the start
  for (size_t i = 1; i < losses.size(); ++i) CHECK(losses[i] < losses[i - 1]);
  CHECK(losses.back() < 0.65 * losses.front());
}
