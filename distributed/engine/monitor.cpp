// distributed/engine/monitor.cpp: the TensorBoard and CSV monitors (see monitor.h).
#include "distributed/engine/monitor.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace kiln {

namespace {

std::string make_log_dir(const char* who, const std::string& output_path, const std::string& job_name) {
  const std::string dir = (std::filesystem::path(output_path) / job_name).string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  KILN_CHECK(!ec && std::filesystem::is_directory(dir),
             "{}: cannot create the directory '{}' (output_path '{}', job_name '{}'){}; give a writable output_path",
             who, dir, output_path, job_name, ec ? ": " + ec.message() : "");
  return dir;
}

}  // namespace

TensorBoardMonitor::TensorBoardMonitor(const std::string& output_path, const std::string& job_name)
    : log_dir_(make_log_dir("tensorboard", output_path, job_name)), writer_(log_dir_) {}

void TensorBoardMonitor::write_events(const std::vector<MonitorEvent>& events) {
  for (const MonitorEvent& e : events) writer_.add_scalar(e.name, e.value, e.step);
  writer_.flush();
}

CsvMonitor::CsvMonitor(const std::string& output_path, const std::string& job_name)
    : log_dir_(make_log_dir("csv_monitor", output_path, job_name)) {}

std::string CsvMonitor::file_of(const std::string& event) const {
  std::string name = event;
  for (char& c : name) {
    if (c == '/' || c == ' ') c = '_';
  }
  return (std::filesystem::path(log_dir_) / (name + ".csv")).string();
}

void CsvMonitor::write_events(const std::vector<MonitorEvent>& events) {
  for (const MonitorEvent& e : events) {
    const std::string path = file_of(e.name);
    std::error_code ec;
    const bool fresh = !std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0;
    std::FILE* f = std::fopen(path.c_str(), "ab");
    KILN_CHECK(f != nullptr, "csv_monitor: cannot open '{}': {}; check that the directory is writable", path,
               std::strerror(errno));
    std::string text;
    if (fresh) text = fmt::format("step,{}\n", e.name.substr(e.name.rfind('/') + 1));  // the header: the name's last part
    // The shortest text that reads back as the same double (Python writes 1.0 where this writes 1).
    text += fmt::format("{},{}\n", e.step, e.value);
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    const bool closed = std::fclose(f) == 0;
    KILN_CHECK(ok && closed, "csv_monitor: writing '{}' failed: {}; check the disk", path, std::strerror(errno));
  }
}

void MonitorMaster::write_events(const std::vector<MonitorEvent>& events) {
  for (auto& m : monitors_) m->write_events(events);
}

}  // namespace kiln
