// nn/nn.h: everything of kiln::nn in one include: Module, the layers (recurrent, attention and
// transformer ones too, AdaptiveLogSoftmaxWithLoss), the losses and functional forms, nn::init, the flops profiler and
// nn::utils (parameter vectors, BatchNorm folding, weight_norm, spectral_norm and parametrize).
#pragma once

#include "nn/activation.h"
#include "nn/adaptive.h"
#include "nn/container.h"
#include "nn/convert_parameters.h"
#include "nn/fusion.h"
#include "nn/conv.h"
#include "nn/flops_profiler.h"
#include "nn/functional.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/norm.h"
#include "nn/packed_sequence.h"
#include "nn/parametrize.h"
#include "nn/resample.h"
#include "nn/rnn.h"
#include "nn/transformer.h"
#include "nn/weight_norm.h"
