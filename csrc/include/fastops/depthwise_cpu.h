// The CPU depthwise kernels, one set per layout: cpu/depthwise_conv2d_nchw.cpp and
// cpu/depthwise_conv2d_nhwc.cpp define them, cpu/depthwise_conv2d.cpp (the op's entry points) and
// cpu/depthwise_separable_conv2d.cpp (the fused op, through NhwcForwardRow) call them. Explicitly
// instantiated for fp32, fp64, fp16 and bf16. Tensors arrive contiguous in the kernel's layout,
// weights and bias already in opmath (weights_acc, bias_acc below).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {

// The kernels of one layout. w: weights_acc(weight, ..., transposed = false) for NCHW, true for NHWC;
// b: bias_acc(...) or undefined. weight_partials returns the weight gradient as partial sums, which
// the caller adds over dim 0 in order: NCHW (N, C, taps + 1), NHWC (items, taps + 1, Cp), the last
// tap slot holding the bias gradient.
template <typename T>
struct DepthwiseLayoutKernels {
  void (*forward)(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, at::Tensor& y,
                  const DepthwiseGeometry& g);
  void (*backward_input)(const at::Tensor& grad_out, const at::Tensor& w, at::Tensor& dx, const DepthwiseGeometry& g);
  at::Tensor (*weight_partials)(const at::Tensor& grad_out, const at::Tensor& x, const DepthwiseGeometry& g);
};

template <typename T>
DepthwiseLayoutKernels<T> nchw_kernels();  // cpu/depthwise_conv2d_nchw.cpp
template <typename T>
DepthwiseLayoutKernels<T> nhwc_kernels();  // cpu/depthwise_conv2d_nhwc.cpp

// Per-thread scratch of the NHWC row kernels: one pixel's in-bounds taps (offset, tap index), the
// sources of one block of pixels, the input and weight rows of one row block.
template <typename T>
struct NhwcRowScratch {
  explicit NhwcRowScratch(const DepthwiseGeometry& g)
      : off(g.taps()), tap(g.taps()), src(g.taps()), row_ptr(g.KH), wrow_ptr(g.KH) {}
  std::vector<int64_t> off, tap;
  std::vector<const T*> src, row_ptr;
  std::vector<const opmath_t<T>*> wrow_ptr;
};

// Per-thread state of the NHWC kernels' whole-row blocks at stride 1 (cpu/depthwise_conv2d_nhwc.cpp),
// shared by the forward and the input gradient: the pixels per block (0: whole-row blocks not used), a
// row of C zeros for the columns outside the map, and one border block's columns, [row][column].
template <typename T>
struct NhwcBorderColumns {
  int64_t pixels = 0;
  std::vector<T> zero;
  std::vector<const T*> cols;

  // Blocks of block_pixels (at most) for a K-wide kernel, channels C, up to KH rows.
  void enable(int64_t block_pixels, int64_t C, int64_t KH, int64_t K) {
    pixels = block_pixels;
    zero.assign(C, T(0));
    cols.resize(KH * (block_pixels - 1 + K));
  }

  // Columns first .. first + U - 1 of nrows rows, each of n pixels of C elements (row(r): its pixel 0);
  // a column outside [0, n) reads the zero row.
  template <typename Row>
  const T* const* list(int64_t nrows, int64_t U, int64_t first, int64_t n, int64_t C, const Row& row) {
    for (int64_t r = 0; r < nrows; ++r) {
      const T* start = row(r);
      for (int64_t u = 0; u < U; ++u) {
        const int64_t col = first + u;
        cols[r * U + u] = col >= 0 && col < n ? start + col * C : zero.data();
      }
    }
    return cols.data();
  }
};

// One output row of the NHWC forward, pixels [ow_begin, ow_end): border pixels tap by tap; interior
// pixels (every kw in bounds) in register blocks, where the valid (kh, kw) taps of the row are the
// contiguous weight rows wt[kh0 * KW ...]. Pixel ow goes to out + (ow - ow_begin) * C. wt is the
// (taps, Cp) weight of weights_acc(..., transposed=true), bias the (Cp,) of bias_acc or nullptr.
// stream: the row blocks write in streaming stores (fp32 only; out and C whole vectors; the caller
// fences, stream_fence). Holds per-thread scratch: make one per task.
template <typename T>
class NhwcForwardRow {
 public:
  using A = opmath_t<T>;
  NhwcForwardRow(const DepthwiseGeometry& g, const A* wt, int64_t Cp, const A* bias, bool stream = false);

  // xb: image n of the NHWC input.
  void run(T* out, const T* xb, int64_t oh, int64_t ow_begin, int64_t ow_end);

 private:
  const DepthwiseGeometry& g_;
  const A* wp_;
  const A* bp_;
  int64_t Cp_, ow_lo_ = 0, ow_hi_ = 0;
  bool stream_, row_block_ = false;
  NhwcRowScratch<T> scratch_;
  NhwcBorderColumns<T> border_;  // the input columns of a block at the map's border
};

// Weights as (C, taps) in the accumulation type (NCHW kernels) or transposed to (taps, Cp) with the
// channel dimension zero-padded to whole vectors (NHWC kernels).
inline at::Tensor weights_acc(const at::Tensor& weight, at::ScalarType acc, bool transposed, int64_t vec) {
  const int64_t C = weight.size(0), taps = weight.size(2) * weight.size(3);
  at::Tensor w = weight.reshape({C, taps}).to(acc);
  if (!transposed) return w.contiguous();
  at::Tensor wt = at::zeros({taps, round_up(std::max<int64_t>(C, 1), vec)}, weight.options().dtype(acc));
  wt.narrow(1, 0, C).copy_(w.t());
  return wt;
}

inline at::Tensor bias_acc(const std::optional<at::Tensor>& bias, at::ScalarType acc, int64_t vec) {
  if (!bias.has_value() || !bias->defined()) return at::Tensor();
  const int64_t C = bias->size(0);
  at::Tensor b = at::zeros({round_up(std::max<int64_t>(C, 1), vec)}, bias->options().dtype(acc));
  b.narrow(0, 0, C).copy_(*bias);
  return b;
}

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
