// distributed/distributed.h: Kiln's distributed module in one include: communicators and their
// collectives (comm/), the ring algorithms written on send/recv (algorithms/), and data
// parallelism (ddp/). See docs/distributed.md.
#pragma once

#include "distributed/algorithms/ring.h"
#include "distributed/comm/communicator.h"
#include "distributed/ddp/ddp.h"
