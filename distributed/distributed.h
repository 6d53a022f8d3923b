// distributed/distributed.h: Kiln's distributed module in one include: communicators and their
// collectives (comm/), the ring algorithms written on send/recv (algorithms/), data parallelism and
// SyncBatchNorm (ddp/), ZeRO (zero/), the DeepSpeed-style engine with its JSON config (engine/),
// pipeline parallelism (pipeline/), tensor parallelism (tensor_parallel/) and the data x pipeline x
// tensor grid of ranks (grid/). See docs/distributed.md, docs/zero.md and docs/parallelism.md.
#pragma once

#include "distributed/algorithms/ring.h"
#include "distributed/comm/communicator.h"
#include "distributed/comm/comms_logger.h"
#include "distributed/ddp/ddp.h"
#include "distributed/ddp/sync_batch_norm.h"
#include "distributed/engine/engine.h"
#include "distributed/grid/grid.h"
#include "distributed/pipeline/pipeline.h"
#include "distributed/tensor_parallel/tensor_parallel.h"
#include "distributed/zero/zero_optimizer.h"
