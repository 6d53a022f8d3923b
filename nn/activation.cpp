// nn/activation.cpp: see nn/activation.h.
#include "nn/activation.h"

namespace kiln::nn {

GELU::GELU(GELUOptions options) : approximate(std::move(options.approximate)) {
  KILN_CHECK(approximate == "none" || approximate == "tanh",
             "nn::GELU: approximate must be 'none' or 'tanh', got '{}'", approximate);
}

}  // namespace kiln::nn
