// core/storage.h: Storage, one device buffer shared by a tensor and all of its views.
//
// It also holds the version counter: every in-place write bumps it, and autograd compares it with
// the version a saved tensor had when it was saved. See Note [version counter] in core/saved_tensor.h.
// Whether its tensors are inference tensors is decided here too, when it is made.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/allocator.h"
#include "core/device.h"
#include "core/grad_mode.h"

namespace kiln {

struct Storage {
  Storage(void* data, size_t nbytes, Device device, Allocator* allocator)
      : data(data), nbytes(nbytes), device(device), allocator(allocator), inference(InferenceMode::is_enabled()) {}
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage() {
    if (allocator != nullptr && data != nullptr) allocator->deallocate(data, nbytes);
  }

  void* data;
  size_t nbytes;
  Device device;
  Allocator* allocator;  // null: memory not owned by Kiln (from_blob)
  uint64_t version = 0;
  // Made in inference mode: the tensors on it are inference tensors (Note [inference mode] in
  // core/grad_mode.h).
  bool inference;
  // How many views of this buffer made without autograd (TensorImpls with counts_as_view) are
  // alive: an in-place op recorded by autograd on their base would leave them behind (Note [views
  // taken without autograd] in ops/record.cpp).
  std::atomic<int64_t> live_views{0};
};

}  // namespace kiln
