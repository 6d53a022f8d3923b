// core/core.cpp: the small out-of-line pieces of core: errors, dtype names and promotion, devices,
// shapes, views, grad mode, the deterministic-algorithms switch, the node counter and the default
// generator.
#include <algorithm>
#include <atomic>
#include <charconv>

#include "core/backend.h"
#include "core/deterministic.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/grad_mode.h"
#include "core/node.h"
#include "core/shape.h"
#include "core/tensor_impl.h"

namespace kiln {

void throw_error(std::string message) { throw Error(std::move(message)); }

// ---- dtypes ----

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
    case DType::Int8: return "int8";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "unknown";
}

namespace {
// The promotion lattice's order: bool < uint8, int8 < int32 < int64 < {float16, bfloat16} < float32
// < float64.
int promotion_rank(DType t) {
  switch (t) {
    case DType::Bool: return 0;
    case DType::UInt8:
    case DType::Int8: return 1;
    case DType::Int32: return 2;
    case DType::Int64: return 3;
    case DType::Float16:
    case DType::BFloat16: return 4;
    case DType::Float32: return 5;
    case DType::Float64: return 6;
  }
  return 0;
}
}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (promotion_rank(a) > promotion_rank(b)) std::swap(a, b);
  // The two 16-bit floats meet at float32 (neither holds the other's range and precision). uint8
  // and int8 meet at int16 in PyTorch, a dtype Kiln lacks: refused rather than widened further.
  if (promotion_rank(a) == promotion_rank(b)) {
    if (is_floating(a)) return DType::Float32;
    KILN_FAIL("promote_types: uint8 with int8 gives int16 in PyTorch, which Kiln has no dtype for; "
              "convert one of them with .to(kInt32) first");
  }
  return b;
}

// ---- devices ----

void throw_bad_cuda_index(int index) {
  KILN_FAIL("Device: CUDA device index {} is out of range; it must be in [0, {})", index, kMaxCudaDevices);
}

Device Device::parse(std::string_view text) {
  if (text == "cpu" || text == "cpu:0") return cpu();  // PyTorch's "cpu:0" too
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view num = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
    const bool canonical = num.size() == 1 || num[0] != '0';  // "cuda:01" is not PyTorch's either
    if (ec == std::errc() && end == num.data() + num.size() && canonical && index >= 0 && index < kMaxCudaDevices) {
      return cuda(index);
    }
  }
  KILN_FAIL("Device: cannot parse \"{}\"; expected \"cpu\", \"cuda\" or \"cuda:N\"", text);
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index);
}

// ---- shapes ----

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < n_; ++i) s += (i ? ", " : "") + std::to_string(d_[i]);
  return s + "]";
}

Shape contiguous_strides(const Shape& sizes) {
  Shape strides;
  set_contiguous_strides(sizes, strides);
  return strides;
}

void set_contiguous_strides(const Shape& sizes, Shape& strides) {
  strides.resize(sizes.size());
  int64_t running = 1;
  for (int i = sizes.size() - 1; i >= 0; --i) {
    strides[i] = running;
    // A shape with a 0 has no elements but still strides: the sizes other than 0 must multiply
    // within int64 too (zeros({0, 1LL << 62, 3}) would wrap its first stride).
    KILN_CHECK(!__builtin_mul_overflow(running, std::max<int64_t>(sizes[i], 1), &running) || i == 0,
               "shape {} is too large: its sizes other than 0 multiply past 2^63", sizes.str());
  }
}

int wrap_dim(int64_t dim, int ndim, const char* op) {
  int64_t n = std::max(ndim, 1);
  KILN_CHECK(dim >= -n && dim < n,
             "{}: dim {} is out of range for a tensor of {} dimension{} (expected {}..{})", op, dim,
             ndim, ndim == 1 ? "" : "s", -n, n - 1);
  return static_cast<int>(dim < 0 ? dim + n : dim);
}

static bool strides_are_contiguous(const Shape& sizes, const Shape& strides) {
  int64_t expected = 1;
  for (int i = sizes.size() - 1; i >= 0; --i) {
    if (sizes[i] == 1) continue;  // a size-1 dim's stride never matters
    if (strides[i] != expected) return sizes.numel() == 0;
    expected *= sizes[i];
  }
  return true;
}
bool View::is_contiguous() const { return strides_are_contiguous(sizes, strides); }
bool TensorImpl::is_contiguous() const { return strides_are_contiguous(sizes, strides); }

// ---- autograd state that core carries ----

namespace {
thread_local bool grad_mode_enabled = true;
thread_local bool inference_mode_enabled = false;
thread_local bool recording = true;  // grad_mode_enabled && !inference_mode_enabled: one load per op
std::atomic<uint64_t> next_sequence_nr{0};
void set_modes(bool grad, bool inference) {
  grad_mode_enabled = grad;
  inference_mode_enabled = inference;
  recording = grad && !inference;
}
}  // namespace
bool GradMode::is_enabled() { return recording; }
void GradMode::set_enabled(bool enabled) { set_modes(enabled, inference_mode_enabled); }

InferenceMode::InferenceMode(bool enabled) : prev_grad_(grad_mode_enabled), prev_inference_(inference_mode_enabled) {
  set_modes(!enabled, enabled);
}
InferenceMode::~InferenceMode() { set_modes(prev_grad_, prev_inference_); }
bool InferenceMode::is_enabled() { return inference_mode_enabled; }

namespace {
std::atomic<bool> deterministic_algorithms{false};  // process-wide, as PyTorch's
}  // namespace
void use_deterministic_algorithms(bool enabled) { deterministic_algorithms.store(enabled, std::memory_order_relaxed); }
bool are_deterministic_algorithms_enabled() { return deterministic_algorithms.load(std::memory_order_relaxed); }

autograd::Node::Node() : sequence_nr(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

// Each edge holds the next node, so freeing the last reference to a graph's root would free the
// nodes one inside another's destructor: a chain of 150,000 ops (y = y + 1 in a loop) overflowed
// the stack. Here the nodes that would die with this one are moved onto a local stack instead and
// freed one at a time, as PyTorch's deleteNode does. Before its edges are looked at, a node on the
// stack frees what it saved (an input saved for backward also holds the node its edge leads to), and
// an edge whose node is still held elsewhere (y * y has two edges to one node) is let go at once, so
// that the last edge to a node is the one that moves it onto the stack.
autograd::Node::~Node() {
  std::vector<std::shared_ptr<Node>> dying;
  auto take_edges = [&dying](std::vector<Edge>& edges) {
    for (Edge& e : edges) {
      if (e.fn == nullptr) continue;
      if (e.fn.use_count() == 1) {
        dying.push_back(std::move(e.fn));
      } else {
        e.fn.reset();
      }
    }
  };
  take_edges(next_edges);  // this node's own saved state is gone already, with its derived part
  while (!dying.empty()) {
    std::shared_ptr<Node> node = std::move(dying.back());
    dying.pop_back();
    node->release_saved();
    take_edges(node->next_edges);
  }  // `node` is freed here, its edges and saved tensors already gone
}

namespace {
thread_local autograd::Node* running_node = nullptr;
}
autograd::Node* autograd::current_node() { return running_node; }
autograd::CurrentNodeGuard::CurrentNodeGuard(Node* n) : prev_(running_node) { running_node = n; }
autograd::CurrentNodeGuard::~CurrentNodeGuard() { running_node = prev_; }

// ---- random ----

Generator& default_generator() {
  static Generator gen;
  return gen;
}
void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace kiln
