// models/train/progress.cpp: see progress.h.
#include "models/train/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace kiln::train {

bool is_terminal(std::FILE* f) {
  const char* term = std::getenv("TERM");
  return isatty(fileno(f)) && !(term && std::strcmp(term, "dumb") == 0);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}

std::string ProgressBar::render(const std::string& label, int64_t done, int64_t total,
                                double elapsed_s, double loss, bool bar, int width) {
  const double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const double rate = elapsed_s > 0 ? static_cast<double>(done) / elapsed_s : 0.0;
  const double eta = rate > 0 ? static_cast<double>(total - done) / rate : NAN;
  const int pct = static_cast<int>(frac * 100);
  if (!bar) {
    return fmt::format("{} step {}/{} ({}%) loss {:.4f} {:.2f} it/s elapsed {} eta {}", label, done,
                       total, pct, loss, rate, format_duration(elapsed_s), format_duration(eta));
  }
  // Eighths of a cell, as tqdm draws them.
  static const char* const kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  const int64_t eighths = static_cast<int64_t>(frac * width * 8);
  std::string cells;
  int used = 0;
  for (int64_t i = 0; i < eighths / 8 && used < width; ++i, ++used) cells += "█";
  if (used < width && eighths % 8 != 0) {
    cells += kEighths[eighths % 8];
    ++used;
  }
  cells.append(static_cast<size_t>(width - used), ' ');
  return fmt::format("{} {:3}%|{}| {}/{} [{}<{}, {:.2f} it/s, loss={:.4f}]", label, pct, cells, done,
                     total, format_duration(elapsed_s), format_duration(eta), rate, loss);
}

ProgressBar::ProgressBar(std::string label, int64_t total, bool terminal, std::FILE* out,
                         double every_s)
    : label_(std::move(label)), total_(total), terminal_(terminal), out_(out), every_s_(every_s),
      start_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(int64_t done, double loss) {
  done_ = done;
  loss_ = loss;
  draw(false);
}

void ProgressBar::finish() {
  if (finished_) return;
  draw(true);
  finished_ = true;
}

void ProgressBar::draw(bool final) {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  // A terminal redraws at most 10 times a second; a log gets a line every every_s_ seconds.
  const double interval = terminal_ ? 0.1 : every_s_;
  if (!final && last_draw_s_ >= 0 && elapsed - last_draw_s_ < interval) return;
  last_draw_s_ = elapsed;
  std::string text = render(label_, done_, total_, elapsed, loss_, terminal_);
  if (terminal_) {
    std::fprintf(out_, "\r%s\033[K%s", text.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
}

}  // namespace kiln::train
