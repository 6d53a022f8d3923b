// autograd/offload.cpp: SaveOnCpu, activation offload through saved-tensor hooks (core/saved_tensor.h).
// Pack copies a saved device tensor to the host and notes which device it came from; unpack copies it
// back there. Between forward and backward the device then holds the parameters and nothing else of
// the graph. The note is kept by the host copy's identity (its TensorImpl), since a hook sees only
// tensors; host tensors pass through both hooks unchanged.
//
// pin_memory: pack is x.to(cpu, non_blocking=true), which lands in pinned memory and is queued on
// the device's current stream; unpack is the non-blocking copy back. Nothing on the host reads the
// host copy, and both copies run in stream order with the kernels that make and use the tensor
// (Note [non_blocking copies] in cuda/copy.cpp), so no synchronization is needed: the device tensor
// freed after pack is handed out again only to later work on its stream, which runs after the copy.
// When backward runs on another stream than forward, the copy back waits for the copy out's event.
#include <map>
#include <mutex>

#include "autograd/autograd.h"
#include "core/tensor_impl.h"

namespace kiln::autograd {

struct SaveOnCpu::State {
  explicit State(bool pin) : pin_memory(pin) {}
  const bool pin_memory;
  std::mutex mutex;
  std::map<const TensorImpl*, std::pair<std::weak_ptr<TensorImpl>, Device>> origin;  // host copy -> device
  int64_t bytes = 0;

  Tensor pack(const Tensor& t) {
    if (t.device().is_cpu()) return t;
    Tensor host = t.to(Device::cpu(), /*non_blocking=*/pin_memory);
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = origin.begin(); it != origin.end();) {  // forget copies that are gone
      it = it->second.first.expired() ? origin.erase(it) : std::next(it);
    }
    origin[host.impl_ptr().get()] = {host.impl_ptr(), t.device()};
    bytes += t.numel() * itemsize(t.dtype());
    return host;
  }

  Tensor unpack(const Tensor& t) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = origin.find(t.impl_ptr().get());
    if (it == origin.end() || it->second.first.lock() != t.impl_ptr()) return t;  // was on the host
    return t.to(it->second.second, /*non_blocking=*/pin_memory);
  }
};

SaveOnCpu::SaveOnCpu(bool pin_memory)
    : state_(std::make_shared<State>(pin_memory)),
      guard_({[s = state_](const Tensor& t) { return s->pack(t); },
              [s = state_](const Tensor& t) { return s->unpack(t); }}) {}

int64_t SaveOnCpu::offloaded_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->bytes;
}

}  // namespace kiln::autograd
