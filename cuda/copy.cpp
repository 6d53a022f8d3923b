// cuda/copy.cpp: Backend::copy for CUDA: host -> device, device -> host, device -> device (same
// device or across devices), with any dtype conversion and any strides on either side (0 and
// negative included). Plain C++: the one device kernel it needs, a strided converting copy on one
// device, is copy_on_device() in elementwise.cu. CPU sibling: cpu/copy.cpp.
//
// Staging, in the order a copy takes it:
//  - Same dtype, both sides contiguous: one cudaMemcpy(Peer)Async.
//  - The host side is strided or broadcast: its distinct elements are first gathered into a
//    contiguous host buffer (a broadcast dim is kept once, not expanded; a negative stride is read
//    in logical order), and on the way back a contiguous host buffer is scattered into it.
//  - The device side is strided, broadcast or of another dtype: a contiguous device buffer of the
//    transferred elements sits between the transfer and copy_on_device(), which converts and
//    writes (or reads) any strides.
// Copies that touch the host, or span two devices, synchronize before returning (Note [CUDA
// streams] in cuda/context.h), except non-blocking ones between pinned memory and a device.
//
// Note [non_blocking copies]
// Backend::copy_non_blocking (x.to(device, non_blocking=true), copy_(src, true)) returns without
// waiting when the host side is pinned memory of host_allocator() (Note [pinned host memory] in
// host_allocator.cpp) and its elements are contiguous (after broadcast dims are dropped), and the
// copy runs on the device's current stream (whose buffers the allocator hands out):
//  - host -> device: the transfer (and the conversion on the device, if any) is queued; the host
//    tensor may be freed or reused by the caller at once, since record_host_use keeps its block from
//    being handed out again before the transfer has run; but writing into it before then changes
//    what arrives, as in PyTorch.
//  - device -> host: the conversion (if any) and the transfer are queued; the host values are there
//    only once the stream has reached that point: synchronize the stream (or an event recorded
//    after the copy, or the device) before reading them.
//  - Either way, the copy first waits for the copies earlier recorded against the same pinned block
//    on other streams (wait_host_uses): a block written from the device on one stream and copied
//    back on another arrives as written. So does a blocking copy from or into a pinned block (its
//    stream waits for them, and the host for its stream).
// Any other copy, pageable memory included, takes the synchronous path: correct, just not
// overlapped.
#include <cstring>
#include <optional>
#include <vector>

#include "cuda/check.h"
#include "cuda/context.h"
#include "cuda/kernels.h"

namespace kiln::cuda {
namespace {

// src stretched to `sizes` (right-aligned, stride 0 where src has size 1 or no dim).
View broadcast_to(const View& src, const Shape& sizes) {
  if (src.sizes == sizes) return src;
  const int lead = sizes.size() - src.ndim();
  KILN_CHECK(lead >= 0, "copy: a source of shape {} cannot be broadcast to {}", src.sizes.str(),
             sizes.str());
  View v = src;
  v.sizes = sizes;
  v.strides = Shape::filled(sizes.size(), 0);
  for (int d = 0; d < src.ndim(); ++d) {
    if (src.sizes[d] == 1) continue;
    KILN_CHECK(src.sizes[d] == sizes[lead + d],
               "copy: a source of shape {} cannot be broadcast to {}", src.sizes.str(),
               sizes.str());
    v.strides[lead + d] = src.strides[d];
  }
  return v;
}

// The distinct elements of a view: its broadcast dims (stride 0) shrunk to size 1.
View compact(const View& v) {
  View c = v;
  for (int d = 0; d < v.ndim(); ++d) {
    if (v.strides[d] == 0) c.sizes[d] = 1;
  }
  return c;
}

// A contiguous buffer holding compact(v)'s elements, seen with v's sizes (stride 0 where v is
// broadcast).
View expand_contiguous(void* data, DType dtype, const View& v) {
  View c = compact(v);
  View e;
  e.data = data;
  e.dtype = dtype;
  e.sizes = v.sizes;
  e.strides = contiguous_strides(c.sizes);
  for (int d = 0; d < v.ndim(); ++d) {
    if (c.sizes[d] != v.sizes[d]) e.strides[d] = 0;
  }
  return e;
}

View contiguous_like(void* data, DType dtype, const Shape& sizes) {
  View v;
  v.data = data;
  v.dtype = dtype;
  v.sizes = sizes;
  v.strides = contiguous_strides(sizes);
  return v;
}

int64_t nbytes(const View& v) { return v.numel() * itemsize(v.dtype); }

// Same dtype, same sizes, one memcpy apart.
bool plain(const View& src, const View& dst) {
  return src.dtype == dst.dtype && src.is_contiguous() && dst.is_contiguous();
}

// dst = src on the host, same dtype and sizes, any strides: an odometer walk, no divisions.
template <typename B>
void host_strided_copy_typed(const View& src, const View& dst) {
  const int nd = dst.ndim();
  const int64_t n = dst.numel();
  const B* s = static_cast<const B*>(src.data);
  B* d = static_cast<B*>(dst.data);
  int64_t idx[kMaxDims] = {};
  int64_t so = 0, dof = 0;
  for (int64_t i = 0; i < n; ++i) {
    d[dof] = s[so];
    for (int k = nd - 1; k >= 0; --k) {
      if (++idx[k] < dst.sizes[k]) {
        so += src.strides[k];
        dof += dst.strides[k];
        break;
      }
      so -= (dst.sizes[k] - 1) * src.strides[k];
      dof -= (dst.sizes[k] - 1) * dst.strides[k];
      idx[k] = 0;
    }
  }
}

void host_strided_copy(const View& src, const View& dst) {
  if (dst.numel() == 0) return;
  switch (itemsize(dst.dtype)) {
    case 1: return host_strided_copy_typed<uint8_t>(src, dst);
    case 2: return host_strided_copy_typed<uint16_t>(src, dst);
    case 4: return host_strided_copy_typed<uint32_t>(src, dst);
    case 8: return host_strided_copy_typed<uint64_t>(src, dst);
    default: KILN_FAIL("copy: unexpected dtype {}", dtype_name(dst.dtype));
  }
}

void sync(cudaStream_t stream) { KILN_CUDA_CHECK(cudaStreamSynchronize(stream)); }

// ---- the four directions ----

void copy_within_device(const View& src, const View& dst, const Stream& s) {
  if (plain(src, dst)) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(nbytes(dst)),
                                    cudaMemcpyDeviceToDevice, stream_of(s)));
    return;
  }
  copy_on_device(src, dst, s);
}

// host -> device. With non_blocking, see Note [non_blocking copies]: `async` decides whether the end
// of the copy is a wait, or an event that keeps the pinned block until the stream gets there.
void copy_host_to_device(const View& src, const View& dst, int device, const Stream& s, bool non_blocking) {
  const cudaStream_t stream = stream_of(s);
  const View src_c = compact(src);  // the distinct elements of src
  const bool pinned = src_c.is_contiguous() && is_pinned_host(src_c.data, static_cast<size_t>(nbytes(src_c)));
  const bool async = non_blocking && stream == current_stream_handle(device) && pinned;
  if (pinned) wait_host_uses(src_c.data, stream);  // what other streams' copies write into the block
  auto finish = [&] {  // after everything is queued
    if (async) return record_host_use(src_c.data, stream);
    sync(stream);  // before the caller's memory, host_buffer and the staging buffer go
  };
  if (plain(src, dst)) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(nbytes(dst)),
                                    cudaMemcpyHostToDevice, stream));
    return finish();
  }
  // The distinct elements of src, contiguous on the host.
  std::vector<unsigned char> host_buffer;
  const void* host = src.data;
  if (!src_c.is_contiguous()) {
    host_buffer.resize(static_cast<size_t>(nbytes(src_c)));
    host_strided_copy(src_c, contiguous_like(host_buffer.data(), src.dtype, src_c.sizes));
    host = host_buffer.data();
  }
  if (src.dtype == dst.dtype && src_c.sizes == dst.sizes && dst.is_contiguous()) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst.data, host, static_cast<size_t>(nbytes(dst)),
                                    cudaMemcpyHostToDevice, stream));
    return finish();
  }
  // Without a wait the staging buffer goes back to the allocator at once: it is reused only by later
  // work on this same stream, which runs after the conversion.
  DeviceBuffer staged(device, static_cast<size_t>(nbytes(src_c)));
  KILN_CUDA_CHECK(cudaMemcpyAsync(staged.data(), host, static_cast<size_t>(nbytes(src_c)),
                                  cudaMemcpyHostToDevice, stream));
  try {
    copy_on_device(expand_contiguous(staged.data(), src.dtype, src), dst, s);
  } catch (...) {
    // The copy queued above may still be reading host memory (host_buffer, or a pinned block no
    // event keeps): let it finish before that memory goes. Its own error, if any, is the one in flight.
    (void)cudaStreamSynchronize(stream);
    throw;
  }
  finish();
}

// device -> host; non_blocking as above.
void copy_device_to_host(const View& src, int device, const View& dst, const Stream& s, bool non_blocking) {
  const cudaStream_t stream = stream_of(s);
  const View src_c = compact(src);
  const auto bytes = static_cast<size_t>(src_c.numel() * itemsize(dst.dtype));
  const bool pinned = src_c.sizes == dst.sizes && dst.is_contiguous() && is_pinned_host(dst.data, bytes);
  const bool async = non_blocking && stream == current_stream_handle(device) && pinned;
  if (pinned) wait_host_uses(dst.data, stream);  // other streams' copies still reading the block
  auto finish = [&] {
    if (async) return record_host_use(dst.data, stream);
    sync(stream);
  };
  if (plain(src, dst)) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(nbytes(dst)),
                                    cudaMemcpyDeviceToHost, stream));
    return finish();
  }
  // The distinct elements of src, converted to dst's dtype and contiguous on the device.
  std::optional<DeviceBuffer> staged;
  const void* dev = src.data;
  if (src.dtype != dst.dtype || !src_c.is_contiguous()) {
    staged.emplace(device, bytes);
    copy_on_device(src_c, contiguous_like(staged->data(), dst.dtype, src_c.sizes), s);
    dev = staged->data();
  }
  if (src_c.sizes == dst.sizes && dst.is_contiguous()) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(dst.data, dev, bytes, cudaMemcpyDeviceToHost, stream));
    return finish();
  }
  std::vector<unsigned char> host_buffer(bytes);
  KILN_CUDA_CHECK(cudaMemcpyAsync(host_buffer.data(), dev, bytes, cudaMemcpyDeviceToHost, stream));
  sync(stream);
  host_strided_copy(expand_contiguous(host_buffer.data(), dst.dtype, src), dst);
}

// src on device a, dst on device b. Device a's current stream is drained before the transfer (it may
// still be producing src); the transfer and the conversion run on b's current stream (whose buffers
// the allocator hands out there), drained at the end.
void copy_across_devices(const View& src, int a, const View& dst, int b, const Stream& s) {
  const View src_c = compact(src);
  const auto bytes = static_cast<size_t>(nbytes(src_c));
  const Stream sa = s.device == Device::cuda(a) ? s : current_stream_of(a);
  std::optional<DeviceBuffer> staged_a;
  const void* from = src.data;
  {
    DeviceGuard guard(a, "copy");
    if (!src_c.is_contiguous()) {
      staged_a.emplace(a, bytes);
      copy_on_device(src_c, contiguous_like(staged_a->data(), src.dtype, src_c.sizes), sa);
      from = staged_a->data();
    }
    sync(stream_of(sa));
  }
  DeviceGuard guard(b, "copy");
  const Stream sb = s.device == Device::cuda(b) ? s : current_stream_of(b);
  if (src.dtype == dst.dtype && src_c.sizes == dst.sizes && dst.is_contiguous()) {
    KILN_CUDA_CHECK(cudaMemcpyPeerAsync(dst.data, b, from, a, bytes, stream_of(sb)));
    return sync(stream_of(sb));
  }
  DeviceBuffer staged_b(b, bytes);
  KILN_CUDA_CHECK(cudaMemcpyPeerAsync(staged_b.data(), b, from, a, bytes, stream_of(sb)));
  copy_on_device(expand_contiguous(staged_b.data(), src.dtype, src), dst, sb);
  sync(stream_of(sb));
}

}  // namespace

void copy_between(const View& src_in, Device src_device, const View& dst, Device dst_device,
                  const Stream& s, bool non_blocking) {
  KILN_CHECK(src_device.is_cuda() || dst_device.is_cuda(),
             "copy: the CUDA backend copies to or from a CUDA device, not {} -> {}",
             src_device.str(), dst_device.str());
  KILN_CHECK(dst.numel() == 0 || (src_in.data != nullptr && dst.data != nullptr),
             "copy: null data pointer ({} -> {})", src_device.str(), dst_device.str());
  const View src = broadcast_to(src_in, dst.sizes);
  if (dst.numel() == 0) return;
  if (src_device.is_cuda() && dst_device.is_cuda()) {
    if (src_device == dst_device) {
      DeviceGuard guard(src_device.index, "copy");
      return copy_within_device(src, dst, s);
    }
    return copy_across_devices(src, src_device.index, dst, dst_device.index, s);
  }
  if (src_device.is_cuda()) {
    DeviceGuard guard(src_device.index, "copy");
    return copy_device_to_host(src, src_device.index, dst, s, non_blocking);
  }
  DeviceGuard guard(dst_device.index, "copy");
  copy_host_to_device(src, dst, dst_device.index, s, non_blocking);
}

}  // namespace kiln::cuda
