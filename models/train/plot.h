// models/train/plot.h: a PNG of a training run (loss against step, test accuracy against epoch; or a
// language model's training and validation losses against step),
// drawn by gnuplot when it is installed (the README's setup installs gnuplot-nox).
#pragma once

#include <string>
#include <vector>

namespace kiln::train {

struct History {
  std::vector<double> step, loss;                        // training loss per logged step
  std::vector<double> epoch, test_loss, test_accuracy;  // after each epoch
};

// Writes DIR/history.tsv and DIR/plot.gp, then runs gnuplot to make DIR/training.png. Returns the
// PNG's path, or "" with `why` set when gnuplot is missing or fails (the run goes on without a plot).
std::string plot_history(const History& history, const std::string& dir, std::string* why);

// A language model's run (train_gpt): the training loss per logged step and the validation loss per
// evaluation, on one panel against the step. Same files and return value as plot_history.
struct LossHistory {
  std::vector<double> step, loss;            // training loss per logged step
  std::vector<double> eval_step, eval_loss;  // validation loss per evaluation
};
std::string plot_losses(const LossHistory& history, const std::string& dir, std::string* why);

}  // namespace kiln::train
