// models/vision.h: the image classifiers kiln-train knows, for 1x28x28 inputs (Fashion-MNIST):
//   mlp     Linear(784,512)-ReLU-Linear(512,256)-ReLU-Linear(256,10)        (BENCHMARKS.md c)
//   cnn     Conv(1->32,3x3,pad 1)-ReLU-MaxPool2 - Conv(32->64,3x3,pad 1)-ReLU-MaxPool2 -
//           Flatten - Linear(3136,128)-ReLU-Linear(128,10)                     (BENCHMARKS.md d)
//   resnet  a small ResNet: a 3x3 stem of 16 channels, three stages of two basic blocks
//           (16, 32, 64 channels at 28, 14, 7 pixels), global average pooling, Linear(64,10)
// Each is an nn::Module written the way DESIGN.md §2 shows a user's model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"

namespace kiln::models {

struct MLP : nn::Module {
  nn::Linear fc1{784, 512}, fc2{512, 256}, fc3{256, 10};
  MLP() { register_modules({{"fc1", fc1}, {"fc2", fc2}, {"fc3", fc3}}); }
  Tensor forward(const Tensor& x) override {
    Tensor h = relu(fc1(x.flatten(1)));
    return fc3(relu(fc2(h)));
  }
};

struct CNN : nn::Module {
  nn::Conv2d conv1{1, 32, 3, {.padding = 1}}, conv2{32, 64, 3, {.padding = 1}};
  nn::Linear fc1{64 * 7 * 7, 128}, fc2{128, 10};
  CNN() { register_modules({{"conv1", conv1}, {"conv2", conv2}, {"fc1", fc1}, {"fc2", fc2}}); }
  Tensor forward(const Tensor& x) override {
    Tensor h = max_pool2d(relu(conv1(x)), 2);
    h = max_pool2d(relu(conv2(h)), 2);
    return fc2(relu(fc1(h.flatten(1))));
  }
};

// conv3x3-BN-ReLU-conv3x3-BN, plus the input (through a 1x1 conv and BN when the shape changes), ReLU.
struct BasicBlock : nn::Module {
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride);
  Tensor forward(const Tensor& x) override;

  nn::Conv2d conv1, conv2;
  nn::BatchNorm2d bn1, bn2;
  nn::Sequential downsample;  // empty: the identity
};

struct ResNet : nn::Module {
  ResNet();
  Tensor forward(const Tensor& x) override;

  nn::Conv2d conv1{1, 16, 3, {.padding = 1, .bias = false}};
  nn::BatchNorm2d bn1{16};
  nn::Sequential layer1, layer2, layer3;
  nn::Linear fc{64, 10};
};

// The names kiln-train accepts, and the model for one of them (an Error for any other name).
const std::vector<std::string>& vision_model_names();
std::shared_ptr<nn::Module> make_vision_model(const std::string& name);

}  // namespace kiln::models
