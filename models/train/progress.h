// models/train/progress.h: a training progress display. On a terminal, a tqdm-style bar redrawn in
// place:
//   epoch 1/3  37%|███████▍            | 174/469 [00:21<00:36, 8.10 it/s, loss=0.4321]
// Elsewhere (a pipe, a log file, CI), a plain line every `every_s` seconds and at the end:
//   epoch 1/3 step 174/469 (37%) loss 0.4321 8.10 it/s elapsed 21s eta 36s
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kiln::train {

class ProgressBar {
 public:
  // `out` is usually stdout; `terminal` decides the style (see is_terminal()).
  ProgressBar(std::string label, int64_t total, bool terminal, std::FILE* out = stdout,
              double every_s = 10.0);
  // Call after each step; `loss` is shown as given.
  void update(int64_t done, double loss);
  // Draws the final state and ends the line.
  void finish();

  // The bar's text for a state, without control characters (what update() draws; tested).
  static std::string render(const std::string& label, int64_t done, int64_t total, double elapsed_s,
                            double loss, bool bar, int width = 20);

 private:
  void draw(bool final);

  std::string label_;
  int64_t total_, done_ = 0;
  double loss_ = 0;
  bool terminal_, finished_ = false;
  std::FILE* out_;
  double every_s_, last_draw_s_ = -1;
  std::chrono::steady_clock::time_point start_;
};

bool is_terminal(std::FILE* f);  // isatty, and TERM is not "dumb"

// "mm:ss" below an hour, "h:mm:ss" above.
std::string format_duration(double seconds);

}  // namespace kiln::train
