// distributed/launcher.cpp: kiln-run, the one-line launcher.
//
//   kiln-run -n 4 ./train_program --flag value        # 4 ranks on this machine
//   kiln-run -n 8 --hosts a:4,b:4 ./train_program     # 4 ranks on each of two machines
//   kiln-run -n 4 --dry-run ./train_program           # print the mpirun command, run nothing
//
// It runs Open MPI's mpirun with what a Kiln job needs, so that nobody has to remember it:
//   - --allow-run-as-root when run as root (containers);
//   - --oversubscribe when there are more ranks than cores here (a test of 4 ranks on a laptop);
//   - every rank started through `kiln-run --rank-exec`, which gives local rank i the GPU i
//     (CUDA_VISIBLE_DEVICES) on a machine with GPUs, before it executes the program;
//   - Open MPI's shared-memory transport without single-copy (CMA needs ptrace rights that
//     containers often lack) unless the user set it;
//   - with --hosts, the variables that steer Kiln, NCCL and the libraries (KILN_*, NCCL_*, OMP_*,
//     OPENBLAS_*, CUDA_* but CUDA_VISIBLE_DEVICES, PATH, LD_LIBRARY_PATH) passed on to the other
//     machines (mpirun -x), which do not inherit this shell's environment; no --oversubscribe (the
//     slots say how many ranks a host takes). The program must be at the same path on every host.
// The same programs run under plain mpirun or Slurm's `srun --mpi=pmix`: Kiln reads its rank from either.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/core.h>

namespace {

constexpr const char* kUsage =
    "usage: kiln-run -n N [--hosts HOST[:SLOTS],...] [--dry-run] [--] PROGRAM [ARGS...]\n"
    "Runs N ranks of PROGRAM under Open MPI's mpirun, one GPU per local rank where there are GPUs.\n"
    "  -n, --np N       number of ranks (processes)\n"
    "  --hosts LIST     machines to run on, as mpirun's --host: HOST:SLOTS runs up to SLOTS ranks\n"
    "                   there, a HOST alone one (default: this machine, up to 64 ranks per core)\n"
    "  --dry-run        print the mpirun command instead of running it\n"
    "  -h, --help       this text\n";

[[noreturn]] void fail(const std::string& message) {
  fmt::print(stderr, "kiln-run: error: {}\n", message);
  std::exit(2);
}

int count_gpus() {  // the NVIDIA driver lists one directory per GPU; no CUDA library needed
  DIR* d = opendir("/proc/driver/nvidia/gpus");
  if (!d) return 0;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// Run as `kiln-run --rank-exec PROGRAM ARGS` inside each rank: pick the GPU, become PROGRAM.
[[noreturn]] void rank_exec(char** argv) {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int gpus = count_gpus();
  if (local && gpus > 0 && !std::getenv("CUDA_VISIBLE_DEVICES")) {
    const std::string dev = std::to_string(std::atoi(local) % gpus);
    setenv("CUDA_VISIBLE_DEVICES", dev.c_str(), 1);
  }
  execvp(argv[0], argv);
  fail(fmt::format("cannot run '{}': {}", argv[0], std::strerror(errno)));
}

// The pieces of s between the separators (one empty piece for an empty s).
std::vector<std::string> split(const std::string& s, char separator) {
  std::vector<std::string> pieces;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(separator, start);
    pieces.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return pieces;
    start = end + 1;
  }
}

// v as a count from 1 to 65536, or 0 when it is not one.
int positive_count(const std::string& v) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  return v.empty() || *end != '\0' || n < 1 || n > 65536 ? 0 : static_cast<int>(n);
}

// A file that exec can run: executable, and not a directory (which access(X_OK) also passes).
bool is_executable_file(const std::filesystem::path& p) {
  std::error_code ec;
  return access(p.c_str(), X_OK) == 0 && std::filesystem::is_regular_file(p, ec);
}

// `program` as exec would find it: a path when it has a '/', else the first match on PATH; "" when
// there is no executable file of that name.
std::string find_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return is_executable_file(program) ? program : "";
  const char* path = std::getenv("PATH");
  for (const std::string& dir : split(path ? path : "/usr/bin:/bin", ':')) {
    std::filesystem::path candidate = std::filesystem::path(dir) / program;
    if (is_executable_file(candidate)) return candidate.string();
  }
  return "";
}

// `arg` as a POSIX shell reads it back: as it is when it holds only safe characters, else in
// single quotes (a ' inside becomes '\''), so that --dry-run prints a command that can be pasted.
std::string shell_quote(const std::string& arg) {
  const bool safe = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || (c != '\0' && std::strchr("_-./:=@%+,", c) != nullptr);
  });
  if (safe) return arg;
  std::string quoted = "'";
  for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string find_mpirun() {
  if (const char* p = std::getenv("KILN_MPIRUN"); p && *p) return p;
  if (std::string found = find_program("mpirun"); !found.empty()) return found;
  fail("mpirun was not found on PATH; install Open MPI (apt-get install openmpi-bin libopenmpi-dev), or set "
       "KILN_MPIRUN to its path");
}

// The ranks that --hosts makes room for: the sum of its SLOTS (1 for a host without).
int64_t count_slots(const std::string& hosts) {
  int64_t total = 0;
  for (const std::string& entry : split(hosts, ',')) {
    const size_t colon = entry.find(':');
    if (entry.empty() || colon == 0) fail(fmt::format("--hosts '{}' has an empty host name; write HOST[:SLOTS],...", hosts));
    const int slots = colon == std::string::npos ? 1 : positive_count(entry.substr(colon + 1));
    if (slots == 0) fail(fmt::format("--hosts: '{}' must be HOST or HOST:SLOTS with SLOTS a positive number", entry));
    total += slots;
  }
  return total;
}

// The names of this environment's variables that the ranks on other hosts need (see above).
// CUDA_VISIBLE_DEVICES is this machine's own: each host picks its GPUs itself (--rank-exec).
std::vector<std::string> forwarded_variables() {
  static constexpr const char* kPrefixes[] = {"KILN_", "NCCL_", "OMP_", "OPENBLAS_", "CUDA_"};
  static constexpr const char* kNames[] = {"PATH", "LD_LIBRARY_PATH"};
  std::vector<std::string> names;
  for (char** e = environ; *e; ++e) {
    const std::string_view var(*e);
    const std::string_view name = var.substr(0, var.find('='));
    bool wanted = false;
    for (const char* p : kPrefixes) wanted = wanted || name.starts_with(p);
    for (const char* n : kNames) wanted = wanted || name == n;
    if (wanted && name != "CUDA_VISIBLE_DEVICES") names.emplace_back(name);
  }
  return names;
}

}  // namespace

constexpr int kMaxRanksPerCore = 64;

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--rank-exec") == 0) rank_exec(argv + 2);

  int np = 0;
  std::string hosts;
  bool dry_run = false;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      fmt::print("{}", kUsage);
      return 0;
    }
    if (a == "--") {  // the end of kiln-run's options, as with getopt
      ++i;
      break;
    }
    if (a == "--dry-run") {
      dry_run = true;
    } else if (a == "-n" || a == "--np" || a == "--hosts") {
      if (i + 1 >= argc) fail(fmt::format("{} needs a value\n{}", a, kUsage));
      const std::string v = argv[++i];
      if (a == "--hosts") {
        if (v.empty()) fail("--hosts needs a list of machines, HOST[:SLOTS],...");
        hosts = v;
      } else {
        np = positive_count(v);
        if (np == 0) fail(fmt::format("-n must be a number of ranks from 1 to 65536, not '{}'", v));
      }
    } else if (!a.empty() && a[0] == '-') {
      fail(fmt::format("unknown option {}\n{}", a, kUsage));
    } else {
      break;  // the program; everything after it is its own
    }
  }
  if (np == 0) fail(fmt::format("say how many ranks with -n N\n{}", kUsage));
  if (i >= argc) fail(fmt::format("no program to run\n{}", kUsage));
  // Here, before mpirun starts N copies of a name that is not there (with --hosts it need only exist
  // on the other machines).
  if (hosts.empty() && find_program(argv[i]).empty())
    fail(fmt::format("cannot run '{}': no executable file of that name{}", argv[i],
                     std::string(argv[i]).find('/') == std::string::npos ? " on PATH" : ""));

  // More ranks than this on one machine is a typo, not a test of oversubscription: mpirun would
  // start them all, a fork bomb.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (hosts.empty() && np > kMaxRanksPerCore * cores)
    fail(fmt::format("-n {} would start {} processes on this machine's {} cores (at most {} per core here); "
                     "ask for fewer ranks, or spread them over machines with --hosts",
                     np, np, cores, kMaxRanksPerCore));
  if (!hosts.empty()) {
    const int64_t slots = count_slots(hosts);
    if (np > slots)
      fail(fmt::format("-n {} asks for more ranks than --hosts {} has slots ({}); give a host more with "
                       "HOST:SLOTS, or list more hosts",
                       np, hosts, slots));
  }

  std::vector<std::string> cmd = {find_mpirun(), "-n", std::to_string(np)};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
  if (!hosts.empty()) {
    cmd.insert(cmd.end(), {"--host", hosts});
    for (const auto& name : forwarded_variables()) cmd.insert(cmd.end(), {"-x", name});
  } else if (np > static_cast<int>(std::thread::hardware_concurrency())) {
    cmd.push_back("--oversubscribe");
  }
  if (!std::getenv("OMPI_MCA_btl_vader_single_copy_mechanism")) {
    cmd.insert(cmd.end(), {"--mca", "btl_vader_single_copy_mechanism", "none"});
  }
  // Each rank starts as this launcher (by its absolute path, for remote hosts too) and becomes the program.
  std::error_code ec;
  std::filesystem::path self = std::filesystem::canonical("/proc/self/exe", ec);
  cmd.push_back(ec ? argv[0] : self.string());
  cmd.push_back("--rank-exec");
  for (int k = i; k < argc; ++k) cmd.push_back(argv[k]);

  if (dry_run) {
    std::string line;
    for (const auto& c : cmd) {
      if (!line.empty()) line += ' ';
      line += shell_quote(c);
    }
    fmt::print("{}\n", line);
    return 0;
  }
  std::vector<char*> args;
  for (auto& c : cmd) args.push_back(c.data());
  args.push_back(nullptr);
  execv(args[0], args.data());
  fail(fmt::format("cannot run {}: {}", cmd[0], std::strerror(errno)));
}
