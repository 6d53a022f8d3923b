// tests/nn/test_convert_parameters.cpp: nn::utils::parameters_to_vector and vector_to_parameters, as
// torch.nn.utils': order, round trip, shared storage, the gradient through the vector, the Errors.
#include "support.h"

using namespace kiln;

TEST_CASE("parameters_to_vector and vector_to_parameters round-trip a model's parameters in order", "[nn][utils]") {
  nn::Sequential net{nn::Linear(3, 2), nn::ReLU(), nn::Linear(2, 1)};
  const std::vector<Tensor> params = net.parameters();  // 0.weight (2, 3), 0.bias (2), 2.weight (1, 2), 2.bias (1)
  const Tensor flat = nn::utils::parameters_to_vector(params);
  CHECK(flat.sizes() == Shape{11});
  test::check_equal(flat.narrow(0, 0, 6), params[0].detach().reshape({-1}));
  test::check_equal(flat.narrow(0, 6, 2), params[1].detach());
  test::check_equal(flat.narrow(0, 8, 2), params[2].detach().reshape({-1}));
  test::check_equal(flat.narrow(0, 10, 1), params[3].detach());
  // The vector is graph-connected: the gradient of <flat, g> is g's slices.
  const Tensor g = arange(11, kFloat32);
  autograd::backward({flat}, {g});
  test::check_equal(params[0].grad(), g.narrow(0, 0, 6).view({2, 3}));
  test::check_equal(params[3].grad(), g.narrow(0, 10, 1));
  // Back: the parameters take the vector's values in its storage (PyTorch's `param.data = ...`).
  const Tensor target = arange(11, kFloat32) * 0.5;
  nn::utils::vector_to_parameters(target, params);
  test::check_equal(net.parameters()[0], target.narrow(0, 0, 6).view({2, 3}));
  test::check_equal(net.parameters()[2], target.narrow(0, 8, 2).view({1, 2}));
  CHECK(params[1].requires_grad());  // still parameters
  target.narrow(0, 6, 1).fill_(-7.0f);
  CHECK(params[1][0].item<float>() == -7.0f);  // sharing target's storage
  test::check_equal(nn::utils::parameters_to_vector(params), target);
}

TEST_CASE("vector_to_parameters refuses a vector of the wrong size", "[nn][utils][errors]") {
  nn::Linear layer(3, 2);
  test::check_error([&] { nn::utils::vector_to_parameters(zeros({7}), layer.parameters()); },
                    {"vector_to_parameters", "1-D with the parameters' 8 elements", "[7]"});
  test::check_error([&] { nn::utils::vector_to_parameters(zeros({2, 4}), layer.parameters()); }, {"[2, 4]"});
  test::check_error([] { nn::utils::parameters_to_vector({}); }, {"parameters_to_vector: no parameters"});
  test::check_error([] { nn::utils::parameters_to_vector({zeros({2}), Tensor()}); }, {"parameter 1 is undefined"});
}
