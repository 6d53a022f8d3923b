// nn/flops_profiler.cpp: nn::FlopsProfiler (nn/flops_profiler.h).
#include "nn/flops_profiler.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "cuda/cuda.h"

namespace kiln::nn {
namespace {

// 1234567 -> "1.23 M", as DeepSpeed's number_to_string.
std::string with_unit(double v, const std::string& unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (i < 5 && std::abs(v) >= 1000) {
    v /= 1000;
    ++i;
  }
  const std::string suffix = prefixes[i] + unit;
  return suffix.empty() ? fmt::format("{:.2f}", v) : fmt::format("{:.2f} {}", v, suffix);
}
std::string milliseconds(double s) { return fmt::format("{:.2f} ms", 1e3 * s); }
std::string percent(double part, double whole) { return fmt::format("{:.2f}%", whole > 0 ? 100 * part / whole : 0.0); }
std::string per_second(int64_t flops, double s) { return s > 0 ? with_unit(flops / s, "FLOPS") : "0.00 FLOPS"; }

int64_t params_of(Module& m, const std::function<int64_t(const Tensor&)>& numel) {
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += numel ? numel(p) : p.numel();  // each parameter once
  return n;
}

}  // namespace

FlopsProfiler::FlopsProfiler(Module& model, std::function<int64_t(const Tensor&)> numel)
    : model_(model), numel_(std::move(numel)) {}

FlopsProfiler::~FlopsProfiler() { end_profile(); }

void FlopsProfiler::start_profile() {
  if (hooks_.empty()) {
    const auto params = model_.parameters();
    device_ = params.empty() ? Device::cpu() : params[0].device();
    profiles_.clear();
    const auto named = model_.named_modules();
    open_.assign(named.size(), {});
    for (size_t i = 0; i < named.size(); ++i) {
      const auto& [name, m] = named[i];
      profiles_.push_back({.name = name,
                           .type = m->name(),
                           .depth = name.empty() ? 0 : 1 + static_cast<int>(std::count(name.begin(), name.end(), '.')),
                           .params = params_of(*m, numel_),
                           .counts = {}});
      hooks_.push_back(m->register_forward_pre_hook([this, i](Module&, const Tensor& x) {
        if (!counting_) return x;  // stopped
        wait_for_device();
        open_[i].push_back({counts_, Clock::now()});
        return x;
      }));
      hooks_.push_back(m->register_forward_hook([this, i](Module&, const Tensor&, const Tensor& y) {
        if (open_[i].empty()) return y;  // entered while stopped, or before start_profile's reset
        wait_for_device();
        const Entry e = open_[i].back();
        open_[i].pop_back();
        ModuleProfile& p = profiles_[i];
        p.counts.macs += counts_.macs - e.counts.macs;
        p.counts.flops += counts_.flops - e.counts.flops;
        p.seconds += std::chrono::duration<double>(Clock::now() - e.time).count();
        ++p.calls;
        return y;
      }));
    }
  }
  reset_profile();
  counting_.reset();  // a second start restarts, as DeepSpeed's
  counting_ = std::make_unique<flops::Counting>(&counts_);
}

void FlopsProfiler::stop_profile() { counting_.reset(); }

void FlopsProfiler::wait_for_device() const {
  if (device_.is_cuda()) cuda::synchronize(device_.index);
}

void FlopsProfiler::reset_profile() {
  counts_ = {};
  for (ModuleProfile& p : profiles_) {
    p.counts = {};
    p.seconds = 0;
    p.calls = 0;
  }
  for (auto& entries : open_) entries.clear();
}

void FlopsProfiler::end_profile() {
  stop_profile();
  for (RemovableHandle& h : hooks_) h.remove();
  hooks_.clear();
}

int64_t FlopsProfiler::get_total_flops() const { return profiles_.empty() ? 0 : profiles_[0].counts.flops; }
int64_t FlopsProfiler::get_total_macs() const { return profiles_.empty() ? 0 : profiles_[0].counts.macs; }
int64_t FlopsProfiler::get_total_params() const {
  return profiles_.empty() ? params_of(model_, numel_) : profiles_[0].params;
}
double FlopsProfiler::get_total_duration() const { return profiles_.empty() ? 0 : profiles_[0].seconds; }

std::string FlopsProfiler::model_profile(int64_t profile_step, int module_depth, int top_modules, bool detailed,
                                         const std::vector<std::string>& extra) const {
  KILN_CHECK(!profiles_.empty(), "FlopsProfiler: nothing was profiled; call start_profile() before the forward");
  KILN_CHECK(top_modules >= 1, "FlopsProfiler: top_modules must be >= 1, not {}", top_modules);
  const ModuleProfile& total = profiles_[0];
  std::string out;
  auto line = [&out](const std::string& label, const std::string& value) {
    out += fmt::format("{:<62}{}\n", label + ": ", value);
  };
  out += "\n-------------------------- Kiln Flops Profiler --------------------------\n";
  out += fmt::format("Profile Summary at step {}:\n", profile_step);
  out += "Notations: number of parameters (params), multiply-accumulate operations (MACs), floating-point\n"
         "operations (flops), floating-point operations per second (FLOPS), forward latency (fwd latency)\n\n";
  line("params per device", with_unit(static_cast<double>(total.params), ""));
  line("fwd MACs per device", with_unit(static_cast<double>(total.counts.macs), "MACs"));
  line("fwd flops per device", with_unit(static_cast<double>(total.counts.flops), ""));
  line("fwd latency", milliseconds(total.seconds));
  line("fwd FLOPS per device = fwd flops per device / fwd latency", per_second(total.counts.flops, total.seconds));
  for (const std::string& e : extra) out += e + "\n";

  int deepest = 0;
  for (const ModuleProfile& p : profiles_) deepest = std::max(deepest, p.depth);
  const int last = module_depth < 0 ? deepest : std::min(module_depth, deepest);
  out += "\n----------------------------- Aggregated Profile per device -----------------------------\n";
  out += fmt::format("Top {} modules in terms of params, MACs or fwd latency at different model depths:\n", top_modules);
  for (int d = 0; d <= last; ++d) {
    std::vector<const ModuleProfile*> at;
    for (const ModuleProfile& p : profiles_) {
      if (p.depth == d) at.push_back(&p);
    }
    auto top = [&](auto key, auto show) {
      std::vector<const ModuleProfile*> sorted = at;
      std::stable_sort(sorted.begin(), sorted.end(),
                       [&](const ModuleProfile* a, const ModuleProfile* b) { return key(*a) > key(*b); });
      std::string s;
      for (size_t i = 0; i < sorted.size() && i < static_cast<size_t>(top_modules); ++i) {
        s += fmt::format("{}'{}': '{}'", i == 0 ? "" : ", ", sorted[i]->name.empty() ? sorted[i]->type : sorted[i]->name,
                         show(*sorted[i]));
      }
      return "{" + s + "}";
    };
    out += fmt::format("depth {}:\n", d);
    out += "    params      - " +
           top([](const ModuleProfile& p) { return static_cast<double>(p.params); },
               [](const ModuleProfile& p) { return with_unit(static_cast<double>(p.params), ""); }) + "\n";
    out += "    MACs        - " +
           top([](const ModuleProfile& p) { return static_cast<double>(p.counts.macs); },
               [](const ModuleProfile& p) { return with_unit(static_cast<double>(p.counts.macs), "MACs"); }) + "\n";
    out += "    fwd latency - " +
           top([](const ModuleProfile& p) { return p.seconds; },
               [](const ModuleProfile& p) { return milliseconds(p.seconds); }) + "\n";
  }
  if (detailed) {
    out += "\n------------------------------ Detailed Profile per device ------------------------------\n";
    out += "Each module's profile follows its name in this order: params, percentage of total params, MACs,\n"
           "percentage of total MACs, fwd latency, percentage of total fwd latency, fwd FLOPS\n\n";
    for (const ModuleProfile& p : profiles_) {
      if (module_depth >= 0 && p.depth > module_depth) continue;
      const std::string name = p.name.empty() ? p.type : fmt::format("({}): {}", p.name.substr(p.name.rfind('.') + 1),
                                                                    p.type);
      out += fmt::format("{}{}({}, {} Params, {}, {} MACs, {}, {} latency, {})\n", std::string(2 * p.depth, ' '), name,
                         with_unit(static_cast<double>(p.params), ""), percent(p.params, total.params),
                         with_unit(static_cast<double>(p.counts.macs), "MACs"),
                         percent(static_cast<double>(p.counts.macs), static_cast<double>(total.counts.macs)),
                         milliseconds(p.seconds), percent(p.seconds, total.seconds),
                         per_second(p.counts.flops, p.seconds));
    }
  }
  out += "------------------------------------------------------------------------------\n";
  return out;
}

void FlopsProfiler::print_model_profile(int64_t profile_step, int module_depth, int top_modules, bool detailed,
                                        const std::string& output_file, const std::vector<std::string>& extra) const {
  const std::string text = model_profile(profile_step, module_depth, top_modules, detailed, extra);
  if (output_file.empty()) {
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    return;
  }
  // Written beside it, under a name of this process's own, and renamed over it: a failed write
  // leaves neither a half-written file nor the temporary one.
  const std::string tmp = fmt::format("{}.tmp.{}", output_file, ::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    KILN_CHECK(f.good(), "FlopsProfiler: cannot write '{}': {}; check that its directory exists and is writable",
               output_file, std::strerror(errno));
    f << text;
    f.close();
    if (!f.good()) {
      std::remove(tmp.c_str());
      KILN_FAIL("FlopsProfiler: writing '{}' failed (is the disk full?); '{}' is unchanged", tmp, output_file);
    }
  }
  if (std::rename(tmp.c_str(), output_file.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    KILN_FAIL("FlopsProfiler: cannot write '{}': {}; it is unchanged", output_file, std::strerror(err));
  }
}

}  // namespace kiln::nn
