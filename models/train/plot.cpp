// models/train/plot.cpp: see plot.h.
#include "models/train/plot.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

namespace kiln::train {

namespace {

bool write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && ok;
}

bool have_gnuplot() { return std::system("command -v gnuplot > /dev/null 2>&1") == 0; }

// A path inside a gnuplot single-quoted string, where a quote is written twice ('it''s').
std::string gp_quoted(const std::string& path) {
  std::string q = "'";
  for (char c : path) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

// gnuplot on `script`, its output discarded: run without a shell, so that no character of the
// output directory's name (a quote, a semicolon) is ever read as a command.
bool run_gnuplot(const std::string& script) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::string program = "gnuplot", arg = script;
  char* argv[] = {program.data(), arg.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return false;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// Writes DIR/history.tsv and DIR/plot.gp and runs gnuplot on them; the PNG's path or "" and why.
std::string draw(const std::string& data, const std::string& script, const std::string& dir, std::string* why) {
  namespace fs = std::filesystem;
  const std::string tsv = (fs::path(dir) / "history.tsv").string();
  const std::string png = (fs::path(dir) / "training.png").string();
  const std::string gp = (fs::path(dir) / "plot.gp").string();
  if (!write_text(tsv, data) || !write_text(gp, script)) {
    *why = fmt::format("could not write {} or {}", tsv, gp);
    return "";
  }
  if (!have_gnuplot()) {
    *why = "gnuplot is not installed (apt-get install gnuplot-nox) so there is no training.png";
    return "";
  }
  std::error_code ec;
  if (!run_gnuplot(gp) || !fs::exists(png, ec)) {
    *why = fmt::format("gnuplot failed on {}", gp);
    return "";
  }
  return png;
}

}  // namespace

std::string plot_history(const History& h, const std::string& dir, std::string* why) {
  namespace fs = std::filesystem;
  // Two blocks in one file: gnuplot addresses them as index 0 and index 1.
  std::string data = "# step\tloss\n";
  // Paired columns of one length (a damaged checkpoint's history is refused when it loads; this
  // never reads past the shorter in any case).
  for (size_t i = 0; i < std::min(h.step.size(), h.loss.size()); ++i) {
    data += fmt::format("{}\t{:.6g}\n", h.step[i], h.loss[i]);
  }
  data += "\n\n# epoch\ttest_loss\ttest_accuracy\n";
  for (size_t i = 0; i < std::min({h.epoch.size(), h.test_loss.size(), h.test_accuracy.size()}); ++i) {
    data += fmt::format("{}\t{:.6g}\t{:.6g}\n", h.epoch[i], h.test_loss[i], h.test_accuracy[i]);
  }
  const std::string tsv = (fs::path(dir) / "history.tsv").string();
  const std::string png = (fs::path(dir) / "training.png").string();
  std::string script = fmt::format(
      "set terminal pngcairo size 1000,420\n"
      "set output {}\n"
      "set multiplot layout 1,2\n"
      "set title 'training loss'; set xlabel 'step'; set ylabel 'loss'; set grid\n"
      "plot {} index 0 using 1:2 with lines title 'train loss'\n"
      "set title 'test accuracy'; set xlabel 'epoch'; set ylabel 'accuracy'; set yrange [0:1]\n"
      "set xrange [0.5:{}]; set xtics 1; set key bottom right\n"  // whole epochs, even just one
      "plot {} index 1 using 1:3 with linespoints pt 7 title 'test accuracy'\n"
      "unset multiplot\n",
      gp_quoted(png), gp_quoted(tsv), h.epoch.empty() ? 1.5 : h.epoch.back() + 0.5, gp_quoted(tsv));
  if (h.epoch.empty()) {
    *why = "no epoch finished, so there is nothing to plot";
    if (!write_text(tsv, data)) *why = fmt::format("could not write {}", tsv);
    return "";
  }
  return draw(data, script, dir, why);
}

std::string plot_losses(const LossHistory& h, const std::string& dir, std::string* why) {
  namespace fs = std::filesystem;
  std::string data = "# step\tloss\n";
  for (size_t i = 0; i < std::min(h.step.size(), h.loss.size()); ++i) {
    data += fmt::format("{}\t{:.6g}\n", h.step[i], h.loss[i]);
  }
  data += "\n\n# step\tvalidation_loss\n";
  for (size_t i = 0; i < std::min(h.eval_step.size(), h.eval_loss.size()); ++i) {
    data += fmt::format("{}\t{:.6g}\n", h.eval_step[i], h.eval_loss[i]);
  }
  if (h.step.empty()) {
    *why = "no step was logged, so there is nothing to plot";
    return "";
  }
  const std::string tsv = (fs::path(dir) / "history.tsv").string();
  std::string script = fmt::format(
      "set terminal pngcairo size 800,450\n"
      "set output {}\n"
      "set title 'loss'; set xlabel 'step'; set ylabel 'cross-entropy (nats per byte)'; set grid\n"
      "plot {} index 0 using 1:2 with lines title 'train'{}\n",
      gp_quoted((fs::path(dir) / "training.png").string()), gp_quoted(tsv),
      h.eval_step.empty() ? "" : fmt::format(", {} index 1 using 1:2 with linespoints pt 7 title 'validation'", gp_quoted(tsv)));
  return draw(data, script, dir, why);
}

}  // namespace kiln::train
