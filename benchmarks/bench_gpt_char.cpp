// bench_gpt_char: BENCHMARKS.md "e. gpt_char": a 4-layer byte-level GPT (842,496 parameters) trained
// 200 steps with AdamW on the fortunes corpus; prints ms_per_step (median of steps 11-200), the loss
// at the last step and the peak RSS as one JSON line. The loop is in gpt_bench.h; the anchors are
// benchmarks/anchors/anchor_gpt_char.cpp (LibTorch) and torch_gpt_char.py (PyTorch).
//   bench_gpt_char [--steps 200] [--layers 4] [--corpus FILE] [--checkpoint] [--no-fusion] [--device cuda]
#include "gpt_bench.h"

int main(int argc, char** argv) { return gpt_bench::run(gpt_bench::parse_args(argc, argv, {})); }
