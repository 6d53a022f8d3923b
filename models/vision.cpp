// models/vision.cpp: see vision.h.
#include "models/vision.h"

namespace kiln::models {

BasicBlock::BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride)
    : conv1(in_channels, out_channels, 3, {.stride = stride, .padding = 1, .bias = false}),
      conv2(out_channels, out_channels, 3, {.padding = 1, .bias = false}),
      bn1(out_channels),
      bn2(out_channels) {
  if (stride != 1 || in_channels != out_channels) {
    downsample.push_back(nn::Conv2d(in_channels, out_channels, 1, {.stride = stride, .bias = false}));
    downsample.push_back(nn::BatchNorm2d(out_channels));
  }
  register_modules({{"conv1", conv1}, {"bn1", bn1}, {"conv2", conv2}, {"bn2", bn2}});
  if (!downsample.empty()) register_module("downsample", downsample);
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor h = relu(bn1(conv1(x)));
  h = bn2(conv2(h));
  return relu(h + (downsample.empty() ? x : downsample(x)));
}

ResNet::ResNet() {
  const int64_t widths[] = {16, 32, 64};
  nn::Sequential* stages[] = {&layer1, &layer2, &layer3};
  int64_t in = 16;
  for (int s = 0; s < 3; ++s) {
    // Shared, not moved: a BasicBlock borrows its members (Note [module ownership]).
    stages[s]->push_back(std::make_shared<BasicBlock>(in, widths[s], s == 0 ? 1 : 2));
    stages[s]->push_back(std::make_shared<BasicBlock>(widths[s], widths[s], 1));
    in = widths[s];
  }
  register_modules({{"conv1", conv1}, {"bn1", bn1}, {"layer1", layer1}, {"layer2", layer2},
                    {"layer3", layer3}, {"fc", fc}});
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor h = relu(bn1(conv1(x)));
  h = layer3(layer2(layer1(h)));
  h = adaptive_avg_pool2d(h, {1, 1}).flatten(1);
  return fc(h);
}

const std::vector<std::string>& vision_model_names() {
  static const std::vector<std::string> names = {"mlp", "cnn", "resnet"};
  return names;
}

std::shared_ptr<nn::Module> make_vision_model(const std::string& name) {
  if (name == "mlp") return std::make_shared<MLP>();
  if (name == "cnn") return std::make_shared<CNN>();
  if (name == "resnet") return std::make_shared<ResNet>();
  KILN_FAIL("no model named '{}': kiln-train knows mlp, cnn and resnet", name);
}

}  // namespace kiln::models
