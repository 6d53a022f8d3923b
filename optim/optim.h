// optim/optim.h: the optimizers, their schedulers, gradient clipping, loss scaling and master
// weights, in one include.
#pragma once

#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/master_weights.h"
#include "optim/optimizer.h"
#include "optim/rmsprop.h"
#include "optim/sgd.h"
#include "optim/warmup_lr.h"
