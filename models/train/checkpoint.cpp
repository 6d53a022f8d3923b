// models/train/checkpoint.cpp: see checkpoint.h.
#include "models/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/safetensors.h"

namespace kiln::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "kiln-checkpoint";
constexpr int kVersion = 1;

void write_file_atomic(const std::string& path, const std::string& text) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  KILN_CHECK(fd >= 0, "cannot write {}: {} (check that the directory exists and is writable)", path,
             std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = done == text.size() && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = ok ? errno : saved;
    ::unlink(tmp.c_str());
    KILN_FAIL("cannot write {}: {}; the previous file, if any, is untouched", path, std::strerror(err));
  }
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);  // make the rename itself durable
    ::close(dfd);
  }
}

void save_checkpoint(const std::string& dir, const Checkpoint& c) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(!ec && fs::is_directory(dir), "cannot create the checkpoint directory {}: {}", dir,
             ec ? ec.message() : "a file of that name is in the way");
  const fs::path d(dir);
  safetensors::save_file(c.model, (d / "model.safetensors").string());
  safetensors::save_file(c.optimizer, (d / "optimizer.safetensors").string());
  const bool has_scheduler = !c.scheduler.empty();
  if (has_scheduler) safetensors::save_file(c.scheduler, (d / "scheduler.safetensors").string());
  const bool has_scaler = !c.scaler.empty();
  if (has_scaler) safetensors::save_file(c.scaler, (d / "scaler.safetensors").string());

  json m;
  m["format"] = kFormat;
  m["version"] = kVersion;
  m["step"] = c.step;
  m["epoch"] = c.epoch;
  m["loader"] = {{"epoch", c.loader.epoch}, {"batch", c.loader.batch}, {"seed", c.loader.seed}};
  m["rng"] = {{"seed", c.rng.seed}, {"offset", c.rng.offset}};
  m["files"] = {{"model", "model.safetensors"}, {"optimizer", "optimizer.safetensors"}};
  if (has_scheduler) m["files"]["scheduler"] = "scheduler.safetensors";
  if (has_scaler) m["files"]["scaler"] = "scaler.safetensors";
  m["config"] = c.config.empty() ? json::object() : json::parse(c.config);
  m["trainer"] = c.extra.empty() ? json::object() : json::parse(c.extra);
  write_file_atomic((d / "checkpoint.json").string(), m.dump(2) + "\n");
}

Checkpoint load_checkpoint(const std::string& dir) {
  const fs::path d(dir);
  const std::string manifest = (d / "checkpoint.json").string();
  std::ifstream in(manifest);
  KILN_CHECK(in.good(), "no checkpoint in {}: {} is missing (a checkpoint directory is what a run "
             "writes to its output directory)", dir, manifest);
  std::stringstream text;
  text << in.rdbuf();
  json m;
  try {
    m = json::parse(text.str());
  } catch (const json::exception& e) {
    KILN_FAIL("{} is not valid JSON ({}): the checkpoint is damaged", manifest, e.what());
  }
  KILN_CHECK(m.is_object() && m.value("format", "") == kFormat,
             "{} is not a Kiln checkpoint manifest (no \"format\": \"{}\")", manifest, kFormat);
  KILN_CHECK(m.value("version", 0) == kVersion, "{}: checkpoint version {} is not supported (this "
             "Kiln reads version {})", manifest, m.value("version", 0), kVersion);
  Checkpoint c;
  try {
    c.step = m.at("step").get<int64_t>();
    c.epoch = m.at("epoch").get<int64_t>();
    c.loader.epoch = m.at("loader").at("epoch").get<int64_t>();
    c.loader.batch = m.at("loader").at("batch").get<int64_t>();
    c.loader.seed = m.at("loader").at("seed").get<uint64_t>();
    c.rng.seed = m.at("rng").at("seed").get<uint64_t>();
    c.rng.offset = m.at("rng").at("offset").get<uint64_t>();
    const json& files = m.at("files");
    c.model = safetensors::load_file((d / files.at("model").get<std::string>()).string());
    c.optimizer = safetensors::load_file((d / files.at("optimizer").get<std::string>()).string());
    if (files.contains("scheduler")) {
      c.scheduler = safetensors::load_file((d / files.at("scheduler").get<std::string>()).string());
    }
    if (files.contains("scaler")) {
      c.scaler = safetensors::load_file((d / files.at("scaler").get<std::string>()).string());
    }
    c.config = m.at("config").dump();
    c.extra = m.at("trainer").dump();
  } catch (const json::exception& e) {
    KILN_FAIL("{}: a field is missing or has the wrong type ({}): the checkpoint is damaged", manifest,
              e.what());
  }
  return c;
}

}  // namespace kiln::train
