// distributed/comm/peer_error.h: PeerError, the kiln::Error of a rank that only learned that another
// rank failed: that rank's own Error says why. A program stopping the job on it (train::
// exit_on_exception) first gives the failing rank a moment to print its message, which the job's
// end would otherwise cut off when this rank stops everyone first.
#pragma once

#include "core/error.h"

namespace kiln::distributed {

class PeerError : public Error {
 public:
  using Error::Error;
};

}  // namespace kiln::distributed
