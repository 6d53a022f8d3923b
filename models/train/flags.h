// models/train/flags.h: command-line flags for Kiln's programs: declare each flag once with its
// default and help line, parse argv, read typed values. A bad flag is a kiln::Error naming it.
//
//   Flags flags("kiln-train", "trains a model on a dataset");
//   flags.add("epochs", "1", "passes over the training set");
//   flags.parse(argc, argv);              // throws kiln::Error on an unknown flag or missing value
//   if (flags.help_requested()) { std::cout << flags.help(); return 0; }
//   int64_t epochs = flags.get_int("epochs");
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::train {

class Flags {
 public:
  Flags(std::string program, std::string summary);

  // --name VALUE (or --name=VALUE); `value` is the default ("" for none).
  void add(std::string name, std::string value, std::string help);
  // --name with no value; false unless given.
  void add_switch(std::string name, std::string help);

  void parse(int argc, const char* const* argv);
  bool help_requested() const { return help_; }
  std::string help() const;

  bool given(const std::string& name) const;  // set on the command line (not just defaulted)
  const std::string& get(const std::string& name) const;
  // An integer in [min, max]; the Error names the flag and the range.
  int64_t get_int(const std::string& name, int64_t min = INT64_MIN, int64_t max = INT64_MAX) const;
  // A finite number (inf and nan are Errors).
  double get_double(const std::string& name) const;
  bool get_switch(const std::string& name) const;
  // The value, which must be one of `choices`; the Error lists them.
  const std::string& get_choice(const std::string& name, const std::vector<std::string>& choices) const;

 private:
  struct Flag {
    std::string name, value, help;
    bool is_switch = false, given = false;
  };
  const Flag& find(const std::string& name) const;

  std::string program_, summary_;
  std::vector<Flag> flags_;
  bool help_ = false;
};

// The end of a program's main on the exception being handled; call it inside `catch (...)`. It
// prints "<program>: error: <message>" and returns 2 for a kiln::Error, 1 for any other exception.
// Running out of memory (kiln::OutOfMemoryError, std::bad_alloc) returns 2 and adds `memory_hint`:
// which of the program's flags size the run. In a job of several ranks it stops them all with that
// code (distributed::abort_job): one rank that fails alone would otherwise leave the others waiting
// in their next collective until its timeout. On a distributed::PeerError (another rank failed) it
// waits 2 s first, so that the failing rank's own message is printed before the job ends.
int exit_on_exception(const char* program, std::string_view memory_hint);

// The text of the file a flag names (--deepspeed-config): an Error naming the flag when it is not a
// regular file (a FIFO would wait for a writer, /dev/zero would never end) or cannot be read.
std::string read_flag_file(const std::string& path, const char* flag);

}  // namespace kiln::train
