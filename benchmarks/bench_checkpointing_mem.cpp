// bench_checkpointing_mem: BENCHMARKS.md "f. checkpointing_mem": gpt_char with 8 layers, 30 steps,
// without and then with activation checkpointing of every block. Each run is a child process of its
// own (forked before Kiln starts any thread), so that each peak RSS is its run's alone. Prints two
// JSON lines, "ckpt":false and "ckpt":true, with ms_per_step (median of steps 11-30), peak_rss_mib,
// and train_increment_mib: the peak minus the RSS just before the first step (model, optimizer and
// corpus already in memory), the figure checkpointing is judged by.
//   bench_checkpointing_mem [--steps 30] [--layers 8] [--corpus FILE] [--full-recompute] [--no-fusion]
#include <sys/wait.h>

#include "gpt_bench.h"

int main(int argc, char** argv) {
  gpt_bench::Options defaults;
  defaults.bench = "checkpointing_mem";
  defaults.layers = 8;
  defaults.steps = 30;
  gpt_bench::Options options = gpt_bench::parse_args(argc, argv, defaults);
  int status = 0;
  for (bool ckpt : {false, true}) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("bench_checkpointing_mem: fork");
      return 1;
    }
    if (pid == 0) {
      options.checkpoint = ckpt;
      std::_Exit(gpt_bench::run(options));
    }
    int child = 0;
    waitpid(pid, &child, 0);
    if (!WIFEXITED(child) || WEXITSTATUS(child) != 0) status = 1;
  }
  return status;
}
