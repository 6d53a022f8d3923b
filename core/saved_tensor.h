// core/saved_tensor.h: SavedTensor, how a backward formula keeps a tensor from its forward.
//
// Note [version counter]
// Every in-place op bumps its storage's version counter (core/storage.h). A SavedTensor remembers
// the version at save time; unpacking it at a different version means the data the backward needs
// was overwritten, and is an Error (PyTorch's "modified by an inplace operation").
//
// Note [saving outputs]
// A node that saves its own output (exp saves exp(x)) must not own that output's grad_fn (itself):
// that would be a reference cycle. So an output is saved without its grad_fn, and unpack() gives
// back a tensor re-attached to the node that produced it, so double backward still works. An output
// is usually saved before the node exists (the backward lambda is built first), so that node is found
// when unpacking: it is the one running (core/node.h, current_node()); and so is the output's place
// among the node's outputs, which the saver gives (output_nr: 1 for the eigenvectors of eigh's
// (eigenvalues, eigenvectors)), so that unpacking attaches it as that output, not as the first.
//
// Saved-tensor hooks (pack on save, unpack on use) are the basis of activation offload. They apply
// to every saved tensor but leaves that require grad (parameters), which are saved as they are.
#pragma once

#include <functional>
#include <memory>

#include "core/tensor.h"

namespace kiln::autograd {

struct SavedTensorHooks {
  std::function<Tensor(const Tensor&)> pack;    // at save time: e.g. copy to host memory
  std::function<Tensor(const Tensor&)> unpack;  // at backward time: e.g. copy back
};

// RAII: installs hooks for every tensor saved in this scope on this thread (nested scopes stack).
class SavedTensorHooksGuard {
 public:
  explicit SavedTensorHooksGuard(SavedTensorHooks hooks);
  ~SavedTensorHooksGuard();
  SavedTensorHooksGuard(const SavedTensorHooksGuard&) = delete;
  SavedTensorHooksGuard& operator=(const SavedTensorHooksGuard&) = delete;
};

class SavedTensor {
 public:
  SavedTensor() = default;
  // is_output: `t` is output number output_nr of the node that saves it (see Note [saving outputs]).
  SavedTensor(const Tensor& t, bool is_output, uint32_t output_nr = 0);

  // The saved tensor, checked against its version; `op` names the node for the error message.
  Tensor unpack(const char* op) const;
  bool defined() const { return data_.defined(); }
  void reset() { *this = SavedTensor(); }

 private:
  Tensor data_;  // without grad_fn when saved as an output; packed form when hooks are on
  // To read the live version. Weak: with pack hooks the original buffer must be free to go (that is
  // the point of offloading), and a buffer that is gone can no longer be modified in place.
  std::weak_ptr<Storage> storage_;
  uint64_t saved_version_ = 0;
  bool is_output_ = false;
  bool requires_grad_ = false;
  uint32_t output_nr_ = 0;
  std::weak_ptr<Node> grad_fn_;  // for outputs: the node that produced them
  std::shared_ptr<Node> grad_fn_strong_;  // for non-leaf inputs given to a pack hook: their producer
  std::function<Tensor(const Tensor&)> unpack_hook_;
};

}  // namespace kiln::autograd
