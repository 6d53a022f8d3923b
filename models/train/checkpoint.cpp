// models/train/checkpoint.cpp: see checkpoint.h.
#include "models/train/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
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

namespace {

// A file or directory name a checkpoint's manifest gives: a plain name inside the checkpoint, not a
// path elsewhere (an absolute path or "../" would load from anywhere).
std::string plain_name(const std::string& name, std::string_view what, const std::string& manifest) {
  KILN_CHECK(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos,
             "{}: {} is '{}', but it must be a plain name inside the checkpoint: the checkpoint is damaged", manifest,
             what, name);
  return name;
}

// The tensors of one of the checkpoint's files, named in its manifest's "files".
TensorDict load_part(const fs::path& dir, const nlohmann::json& files, const char* key, const std::string& manifest) {
  const std::string name = plain_name(files.at(key).get<std::string>(), fmt::format("files.{}", key), manifest);
  return safetensors::load_file((dir / name).string());
}

void fsync_directory(const fs::path& dir) {  // makes the renames in `dir` durable
  if (int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& text) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // Built by appending: "." + string makes GCC 12 warn falsely (-Wrestrict).
  std::string tmp_name(1, '.');
  tmp_name += target.filename().string();
  tmp_name += ".tmp.";
  tmp_name += std::to_string(getpid());
  const std::string tmp = (dir / tmp_name).string();
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
  fsync_directory(dir);
}

namespace {

// The checkpoint directory `dir` as written: "out/checkpoint/" and "out/checkpoint" are one path.
fs::path checkpoint_path(const std::string& dir) {
  fs::path path = fs::path(dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  return path;
}

// Where the previous checkpoint waits while a save replaces it on a file system without
// RENAME_EXCHANGE (Note [replacing a checkpoint whole]).
fs::path previous_path(const fs::path& target) {
  return target.parent_path() / (target.filename().string() + ".previous");
}

void write_files(const fs::path& d, const Checkpoint& c) {
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
  write_file_atomic((d / "checkpoint.json").string(), m.dump(2) + "\n");  // fsyncs d as well
}

}  // namespace

// Note [replacing a checkpoint whole]
// A checkpoint is several files, and a crash between two of them must not leave a directory whose
// model is one step's and whose optimizer is another's (an earlier version wrote each file in place,
// atomically but one after the other, and a resume then mixed two saves without a word). So a save
// writes a whole new directory, ".<name>.saving-<pid>" beside `dir`, and then swaps it with `dir` in
// one renameat2(RENAME_EXCHANGE): at every moment `dir` is either the old checkpoint or the new one.
// The old one, now in the staging name, is then removed. Where the file system cannot exchange, the
// old directory is first renamed to "<name>.previous"; a crash between that rename and the next
// leaves no `dir`, and load_checkpoint then names "<name>.previous", which is whole. Staging
// directories left by killed saves are removed by the next save.
void save_checkpoint(const std::string& dir, const Checkpoint& c) {
  const fs::path target = checkpoint_path(dir);
  KILN_CHECK(!target.empty(), "save_checkpoint: the checkpoint directory is an empty path; name a directory");
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string name = target.filename().string();
  std::error_code ec;
  fs::create_directories(parent, ec);
  KILN_CHECK(!ec && fs::is_directory(parent), "cannot create the checkpoint directory {}: {}", dir,
             ec ? ec.message() : fmt::format("a file named {} is in the way", parent.string()));
  KILN_CHECK(!fs::exists(target) || fs::is_directory(target),
             "cannot create the checkpoint directory {}: a file of that name is in the way", dir);

  const std::string stage_prefix = "." + name + ".saving-";
  for (const auto& entry : fs::directory_iterator(parent, ec)) {  // left by killed saves
    const std::string entry_name = entry.path().filename().string();
    if (!entry_name.starts_with(stage_prefix)) continue;
    const pid_t owner = static_cast<pid_t>(std::atoll(entry_name.c_str() + stage_prefix.size()));
    const bool alive = owner > 0 && owner != getpid() && (::kill(owner, 0) == 0 || errno == EPERM);
    if (!alive) fs::remove_all(entry.path(), ec);  // a live process's save is its own
  }
  const fs::path stage = parent / (stage_prefix + std::to_string(getpid()));
  fs::create_directory(stage, ec);
  KILN_CHECK(!ec, "cannot create the checkpoint directory {}: {} (while making {}); check that {} is writable",
             dir, ec.message(), stage.string(), parent.string());
  try {
    write_files(stage, c);
  } catch (...) {
    fs::remove_all(stage, ec);  // the previous checkpoint, if any, is untouched
    throw;
  }

  int rc = 0;
  if (fs::exists(target)) {
    rc = ::renameat2(AT_FDCWD, stage.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP)) {
      const fs::path previous = previous_path(target);
      fs::remove_all(previous, ec);
      rc = std::rename(target.c_str(), previous.c_str());
      if (rc == 0) rc = std::rename(stage.c_str(), target.c_str());
      if (rc == 0) fs::remove_all(previous, ec);
    }
  } else {
    rc = std::rename(stage.c_str(), target.c_str());
  }
  const int err = errno;
  fsync_directory(parent);
  fs::remove_all(stage, ec);  // after an exchange, the old checkpoint; after a failure, the new one
  if (ec) {
    std::fprintf(stderr, "warning: could not remove %s: %s; remove it by hand\n", stage.c_str(), ec.message().c_str());
  }
  const fs::path previous = previous_path(target);
  if (rc == 0) {
    fs::remove_all(previous, ec);  // one left by an earlier save cut short
    return;
  }
  KILN_FAIL("cannot replace the checkpoint {}: {}; {}", dir, std::strerror(err),
            fs::exists(previous) ? fmt::format("the previous checkpoint is whole in {}", previous.string())
                                 : std::string("the previous checkpoint, if any, is untouched"));
}

Checkpoint load_checkpoint(const std::string& dir) {
  const fs::path d(dir);
  const std::string manifest = (d / "checkpoint.json").string();
  std::ifstream in;
  std::error_code ec;  // the non-throwing forms: a name too long or a symbolic link loop is "missing"
  if (fs::is_regular_file(manifest, ec)) in.open(manifest);  // a FIFO would block the open
  if (!in.is_open() || !in.good()) {
    const fs::path previous = previous_path(checkpoint_path(dir));
    KILN_CHECK(!fs::exists(previous / "checkpoint.json", ec),
               "no checkpoint in {}, but {} holds one: a save was cut short while it replaced the checkpoint "
               "(Note [replacing a checkpoint whole] in models/train/checkpoint.cpp); resume from {}",
               dir, previous.string(), previous.string());
    KILN_FAIL("no checkpoint in {}: {} is missing (a checkpoint directory is what a run writes to its output "
              "directory)", dir, manifest);
  }
  std::stringstream text;
  text << in.rdbuf();
  json m;
  try {
    m = json::parse(text.str());
  } catch (const json::exception& e) {
    KILN_FAIL("{} is not valid JSON ({}): the checkpoint is damaged", manifest, e.what());
  }
  KILN_CHECK(m.is_object() && m.contains("format") && m["format"] == kFormat,
             "{} is not a Kiln checkpoint manifest (no \"format\": \"{}\")", manifest, kFormat);
  KILN_CHECK(m.contains("version") && m["version"] == kVersion,
             "{}: checkpoint version {} is not supported (this Kiln reads version {})", manifest,
             m.contains("version") ? m["version"].dump() : "(none)", kVersion);
  Checkpoint c;
  try {
    c.step = m.at("step").get<int64_t>();
    c.epoch = m.at("epoch").get<int64_t>();
    c.loader.epoch = m.at("loader").at("epoch").get<int64_t>();
    c.loader.batch = m.at("loader").at("batch").get<int64_t>();
    c.loader.seed = m.at("loader").at("seed").get<uint64_t>();
    c.rng.seed = m.at("rng").at("seed").get<uint64_t>();
    c.rng.offset = m.at("rng").at("offset").get<uint64_t>();
    constexpr int64_t kMax = int64_t{1} << 53;  // beyond any run, and far from wrapping at the next step
    KILN_CHECK(c.step >= 0 && c.epoch >= 0 && c.loader.epoch >= 0 && c.loader.batch >= 0 && c.step < kMax &&
                   c.epoch < kMax && c.loader.epoch < kMax && c.loader.batch < kMax,
               "{}: step {}, epoch {}, loader epoch {} and loader batch {} must all be in [0, 2^53): the checkpoint is "
               "damaged", manifest, c.step, c.epoch, c.loader.epoch, c.loader.batch);
    const json& files = m.at("files");
    c.model = load_part(d, files, "model", manifest);
    c.optimizer = load_part(d, files, "optimizer", manifest);
    if (files.contains("scheduler")) {
      c.scheduler = load_part(d, files, "scheduler", manifest);
    }
    if (files.contains("scaler")) {
      c.scaler = load_part(d, files, "scaler", manifest);
    }
    KILN_CHECK(m.at("config").is_object() && m.at("trainer").is_object(),
               "{}: \"config\" and \"trainer\" must be JSON objects: the checkpoint is damaged", manifest);
    c.config = m.at("config").dump();
    c.extra = m.at("trainer").dump();
  } catch (const json::exception& e) {
    KILN_FAIL("{}: a field is missing or has the wrong type ({}): the checkpoint is damaged", manifest,
              e.what());
  }
  return c;
}

std::FILE* open_metrics(const std::string& path, bool resume, int64_t step) {
  // A regular file or none: a FIFO in its place would block the open (and a device never end).
  std::error_code ec;
  KILN_CHECK(!fs::exists(path, ec) || fs::is_regular_file(path, ec),
             "{} is not a regular file; remove it, or choose another output directory", path);
  if (resume) {
    std::ifstream in(path);
    if (in.good()) {
      std::string kept, line;
      while (std::getline(in, line)) {
        // A line cut short by a crash does not parse, and goes too.
        const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
            j["step"].get<int64_t>() <= step) {
          kept += line + "\n";
        }
      }
      write_file_atomic(path, kept);
    }
  }
  std::FILE* f = std::fopen(path.c_str(), resume ? "a" : "w");
  KILN_CHECK(f != nullptr, "cannot write {}: {}", path, std::strerror(errno));
  return f;
}

void write_metrics_line(std::FILE* f, const std::string& path, const std::string& line) {
  if (f == nullptr) return;
  const bool ok = std::fprintf(f, "%s\n", line.c_str()) >= 0 && std::fflush(f) == 0;
  KILN_CHECK(ok, "cannot write {}: {}", path, std::strerror(errno));
}

OutDirLock::OutDirLock(const std::string& dir) {
  KILN_CHECK(!dir.empty(), "--out must name a directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(!ec && fs::is_directory(dir), "cannot use --out {}: {}", dir,
             ec ? ec.message() : "a file of that name is in the way");
  const fs::path checkpoint = fs::path(dir) / "checkpoint";  // found now, not at the first save
  KILN_CHECK(!fs::exists(checkpoint) || fs::is_directory(checkpoint),
             "cannot save checkpoints in {}: a file of that name is in the way; remove it or choose another --out",
             checkpoint.string());
  const std::string path = (fs::path(dir) / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);  // also the probe that --out is writable
  KILN_CHECK(fd_ >= 0, "cannot write into --out {}: {}", dir, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    KILN_CHECK(err != EWOULDBLOCK, "another run is writing to {} (it holds {}); wait for it to end, or choose "
               "another --out", dir, path);
    KILN_FAIL("cannot lock {}: {}", path, std::strerror(err));
  }
}

OutDirLock::~OutDirLock() { ::close(fd_); }  // and so the lock goes

void check_resume_flags(const std::string& saved, const std::string& wanted,
                        const std::vector<std::pair<std::string, std::string>>& given, const std::string& source) {
  const json have = json::parse(saved), want = json::parse(wanted);
  for (const auto& [flag, key] : given) {
    if (!have.contains(key) || !want.contains(key) || have.at(key) == want.at(key)) continue;
    KILN_FAIL("--{} asks for {} = {} but the checkpoint ({}) has {} = {}: a resumed run keeps its settings; drop "
              "--{}, or start a new run without --resume",
              flag, key, want.at(key).dump(), source, key, have.at(key).dump(), flag);
  }
}

std::string engine_dir_of(const std::string& ckpt_dir) {
  fs::path p = fs::path(ckpt_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return (p.parent_path() / (p.filename().string() + "-engine")).string();
}

std::string engine_tag_of(const Checkpoint& ckpt, const std::string& source) {
  std::string tag;
  try {
    tag = nlohmann::json::parse(ckpt.extra).value("engine_tag", std::string());
  } catch (const nlohmann::json::exception&) {
  }
  KILN_CHECK(!tag.empty(), "{}: the checkpoint names no engine checkpoint: it was written without a DeepSpeed "
             "config (resume it without --deepspeed-config), or it is damaged", source);
  return plain_name(tag, "engine_tag", source);
}

void remove_other_engine_checkpoints(const std::string& ckpt_dir, const std::string& tag) {
  // Old engine checkpoints are tidied, not needed: one that cannot be removed stays, with a warning,
  // after a save that has succeeded.
  std::error_code ec;
  for (fs::directory_iterator it(engine_dir_of(ckpt_dir), ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code rm;
    if (!it->is_directory(rm) || it->path().filename() == tag) continue;
    if (fs::remove_all(it->path(), rm) == static_cast<std::uintmax_t>(-1)) {
      std::fprintf(stderr, "warning: could not remove the old engine checkpoint %s: %s\n", it->path().c_str(),
                   rm.message().c_str());
    }
  }
}

}  // namespace kiln::train
