// data/data.h: everything in data/, in one include: datasets, the DataLoader, Fashion-MNIST /
// MNIST, synthetic images, byte-level text, safetensors files, and TensorBoard event files.
#pragma once

#include "data/byte_text.h"
#include "data/dataloader.h"
#include "data/sampler.h"
#include "data/dataset.h"
#include "data/mnist.h"
#include "data/safetensors.h"
#include "data/synthetic.h"
#include "data/tensorboard.h"
