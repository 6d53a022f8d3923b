// models/train/flags.cpp: see flags.h.
#include "models/train/flags.h"

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <thread>

#include "core/error.h"
#include "data/gzip_file.h"
#include "distributed/comm/communicator.h"
#include "distributed/comm/peer_error.h"

namespace kiln::train {

Flags::Flags(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void Flags::add(std::string name, std::string value, std::string help) {
  flags_.push_back({std::move(name), std::move(value), std::move(help)});
}

void Flags::add_switch(std::string name, std::string help) {
  flags_.push_back({std::move(name), "", std::move(help), /*is_switch=*/true});
}

const Flags::Flag& Flags::find(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f;
  }
  KILN_FAIL("{}: no flag --{} is declared (a bug in {})", program_, name, program_);
}

void Flags::parse(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      help_ = true;
      continue;
    }
    KILN_CHECK(arg.size() > 2 && arg.starts_with("--"),
               "unexpected argument '{}': flags look like --name value (see --help)", arg);
    std::string name = arg.substr(2), value;
    bool inline_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    Flag* flag = nullptr;
    for (Flag& f : flags_) {
      if (f.name == name) flag = &f;
    }
    KILN_CHECK(flag != nullptr, "unknown flag --{} (see --help for the flags {} takes)", name, program_);
    if (flag->is_switch) {
      KILN_CHECK(!inline_value, "--{} takes no value", name);
      flag->value.assign(1, '1');  // not = "1": GCC 12 warns falsely (-Wrestrict) on that
    } else if (!inline_value) {
      KILN_CHECK(i + 1 < argc, "--{} needs a value ({})", name, flag->help);
      value = argv[++i];
    }
    if (!flag->is_switch) flag->value = value;
    flag->given = true;
  }
}

std::string Flags::help() const {
  std::string out = fmt::format("usage: {} [flags]\n{}\n\nflags:\n", program_, summary_);
  for (const Flag& f : flags_) {
    std::string left = f.is_switch ? "--" + f.name : "--" + f.name + " VALUE";
    std::string def = f.is_switch || f.value.empty() ? "" : fmt::format(" (default: {})", f.value);
    out += fmt::format("  {:<24} {}{}\n", left, f.help, def);
  }
  out += "  --help                   this text\n";
  return out;
}

bool Flags::given(const std::string& name) const { return find(name).given; }
const std::string& Flags::get(const std::string& name) const { return find(name).value; }
bool Flags::get_switch(const std::string& name) const { return !find(name).value.empty(); }

int64_t Flags::get_int(const std::string& name, int64_t min, int64_t max) const {
  const std::string& v = get(name);
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  KILN_CHECK(!v.empty() && *end == '\0' && errno == 0, "--{} must be an integer, not '{}'", name, v);
  KILN_CHECK(x >= min, "--{} must be at least {}, not {}", name, min, x);
  KILN_CHECK(x <= max, "--{} must be at most {}, not {}", name, max, x);
  return x;
}

double Flags::get_double(const std::string& name) const {
  const std::string& v = get(name);
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v.c_str(), &end);
  // ERANGE: an underflow (1e-320, kept as the tiny number it is) or an overflow (inf, refused next).
  KILN_CHECK(!v.empty() && *end == '\0' && (errno == 0 || errno == ERANGE), "--{} must be a number, not '{}'", name, v);
  KILN_CHECK(std::isfinite(x), "--{} must be a finite number, not '{}'", name, v);
  return x;
}

const std::string& Flags::get_choice(const std::string& name,
                                     const std::vector<std::string>& choices) const {
  const std::string& v = get(name);
  for (const std::string& c : choices) {
    if (c == v) return v;
  }
  KILN_FAIL("--{} must be one of {}, not '{}'", name, fmt::format("{}", fmt::join(choices, ", ")), v);
}

int exit_on_exception(const char* program, std::string_view memory_hint) {
  std::string message;
  int code = 2;
  bool peer = false;  // another rank failed, and its own Error says why
  try {
    throw;
  } catch (const distributed::PeerError& e) {
    message = e.what();
    peer = true;
  } catch (const OutOfMemoryError& e) {
    message = fmt::format("{}. {}", e.what(), memory_hint);
  } catch (const std::bad_alloc&) {
    message = fmt::format("out of CPU memory (std::bad_alloc). {}", memory_hint);
  } catch (const Error& e) {
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
    code = 1;
  } catch (...) {
    message = "an exception that is not a std::exception";
    code = 1;
  }
  std::fprintf(stderr, "%s: error: %s\n", program, message.c_str());
  // The rank that failed prints why and stops the job itself; stopping it from here at once could
  // kill that rank before it has printed (seen on a loaded machine), so this rank waits a moment.
  // The world's size once, and as 1 when the launcher's variables are what failed (RANK=abc): asked
  // again here, they would throw out of this handler and abort.
  int world = 1;
  try {
    world = distributed::world_info().size;
  } catch (const std::exception&) {
  }
  if (peer && world > 1) std::this_thread::sleep_for(std::chrono::seconds(2));
  if (world > 1) distributed::abort_job(code);
  return code;
}

std::string read_flag_file(const std::string& path, const char* flag) {
  // data::open_regular_file refuses a FIFO (without waiting for a writer), a device or a directory.
  const std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(
      data::open_regular_file(path, fmt::format("--{}: ", flag), "check the path"), &std::fclose);
  std::string text;
  char chunk[1 << 16];
  for (size_t got; (got = std::fread(chunk, 1, sizeof chunk, in.get())) > 0;) text.append(chunk, got);
  KILN_CHECK(!std::ferror(in.get()), "--{}: reading '{}' failed", flag, path);
  return text;
}

}  // namespace kiln::train
