// distributed/distributed.h: Kiln's distributed module in one include: communicators and their
// collectives (comm/), the ring algorithms written on send/recv (algorithms/), data parallelism
// (ddp/), ZeRO (zero/) and the DeepSpeed-style engine with its JSON config (engine/). See
// docs/distributed.md and docs/zero.md.
#pragma once

#include "distributed/algorithms/ring.h"
#include "distributed/comm/communicator.h"
#include "distributed/ddp/ddp.h"
#include "distributed/engine/engine.h"
#include "distributed/zero/zero_optimizer.h"
