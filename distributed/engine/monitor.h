// distributed/engine/monitor.h: DeepSpeed's monitors, where the engine writes its training events
// ("tensorboard" and "csv_monitor" in ds_config.json).
//
// An event is (name, value, step), the step counted in samples as DeepSpeed's global_samples. The
// engine writes, on rank 0 (as DeepSpeed's engine):
//   Train/Samples/train_loss   at each accumulation boundary's backward: the mean of rank 0's
//                              micro-batch losses of this step (train_batch: the batch's loss),
//                              at the samples before the step
//   Train/Samples/lr           after each optimizer step (the first group's), at the samples after it
//   Train/Samples/loss_scale   with fp16, likewise
//   Train/Samples/elapsed_time_ms_forward, _backward, _step   with wall_clock_breakdown, likewise:
//                              the milliseconds spent in each since the last print
//
// TensorBoardMonitor writes them to an event file in output_path/job_name/ (data/tensorboard.h);
// CsvMonitor to one file per event there, its name the event's with '/' and ' ' made '_'
// (Train_Samples_train_loss.csv), "step,<last part of the name>" its first line and "step,value"
// the others. Both flush after each write, so that what a crash leaves is readable.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/tensorboard.h"

namespace kiln {

struct MonitorEvent {
  std::string name;
  double value;
  int64_t step;
};

class Monitor {
 public:
  virtual ~Monitor() = default;
  virtual void write_events(const std::vector<MonitorEvent>& events) = 0;
  virtual const std::string& log_dir() const = 0;
};

class TensorBoardMonitor final : public Monitor {
 public:
  // Creates output_path/job_name (an Error when it cannot) and an event file in it.
  TensorBoardMonitor(const std::string& output_path, const std::string& job_name);
  void write_events(const std::vector<MonitorEvent>& events) override;
  const std::string& log_dir() const override { return log_dir_; }
  const std::string& event_file() const { return writer_.path(); }

 private:
  std::string log_dir_;
  tensorboard::SummaryWriter writer_;
};

class CsvMonitor final : public Monitor {
 public:
  // Creates output_path/job_name (an Error when it cannot). A file already there (a resumed run)
  // is appended to, without a second header.
  CsvMonitor(const std::string& output_path, const std::string& job_name);
  void write_events(const std::vector<MonitorEvent>& events) override;
  const std::string& log_dir() const override { return log_dir_; }
  // The file an event goes to: log_dir/<name, '/' and ' ' made '_'>.csv
  std::string file_of(const std::string& event) const;

 private:
  std::string log_dir_;
};

// DeepSpeed's MonitorMaster: every monitor the config enables, written to together.
class MonitorMaster {
 public:
  void add(std::unique_ptr<Monitor> m) { monitors_.push_back(std::move(m)); }
  bool enabled() const { return !monitors_.empty(); }
  void write_events(const std::vector<MonitorEvent>& events);
  const std::vector<std::unique_ptr<Monitor>>& monitors() const { return monitors_; }

 private:
  std::vector<std::unique_ptr<Monitor>> monitors_;
};

}  // namespace kiln
