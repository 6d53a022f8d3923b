// kiln/kiln.h: everything a Kiln user needs, in one include.
//
//   #include <kiln/kiln.h>
//   using namespace kiln;
//   Tensor w = randn({3, 1}).requires_grad_();
//   Tensor loss = (matmul(x, w) - y).square().mean();
//   loss.backward();                      // w.grad() now holds d loss / d w
#pragma once

#include "autograd/autograd.h"
#include "core/deterministic.h"
#include "core/generator.h"
#include "core/grad_mode.h"
#include "core/tensor.h"
#include "core/tensor_dict.h"
#include "cpu/parallel.h"
#include "cuda/cuda.h"
#include "cuda/profiler.h"
#include "data/data.h"
#include "distributed/distributed.h"
#include "nn/nn.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "optim/optim.h"
