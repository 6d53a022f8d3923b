// core/deterministic.h: the process-wide switch for deterministic algorithms, as PyTorch's
// torch.use_deterministic_algorithms. When it is on, an op whose usual GPU kernel may give different
// bits from run to run (atomic additions in an unspecified order, a racing store) takes a
// deterministic kernel instead. Off by default. What it changes, op by op:
// docs/cuda.md, "Deterministic mode".
#pragma once

namespace kiln {

void use_deterministic_algorithms(bool enabled);
bool are_deterministic_algorithms_enabled();

}  // namespace kiln
