// The CUDA depthwise weight gradient for NHWC tensors whose channels split into 16-byte vectors, written
// as host+device functions: the kernels in csrc/cuda/depthwise_conv2d.cu call them with their block and
// thread indices, and tests/ops/test_depthwise_conv2d.py runs the same functions over the same grid on
// the CPU (test_nhwc_weight_gradient_kernel_on_the_host), so the index arithmetic, the edges and the
// summation order are tested without a GPU.
//
//   dw[c, kh, kw] = sum over (n, oh, ow) of g[n, oh, ow, c] * x[n, oh*sh - pt + kh*dh, ow*sw - pl + kw*dw, c]
//   db[c] = sum of g[n, oh, ow, c]
//
// Work: the R = N * OH output rows are cut into `slots` runs of rows_per_slot rows. A task is (slot,
// channel vector cv of V channels); the thread of task t and kernel row kh (threadIdx.y: the K threads
// of one task share its g loads through L1) walks the slot's rows, and along each row every output
// pixel: one vector load of g, K of x (the kw taps of row kh), K * V FMAs into K * V fp32 registers;
// kh = 0 also sums g for the bias (at unit stride along the row, one x load per pixel: a sliding
// window of K columns, nhwc_row_unit_stride). It writes its K * V tap sums (and V bias sums) into
// ws[slot][c][taps + 1] (taps + 1 floats per channel, the bias last), every entry exactly once, zeros
// where the rows miss the image. The slots are then added in a fixed order: groups of kGroupRows slots
// first (sum_slot_group: one thread per (group, column)), then the groups in order. No atomics; the
// result depends on the shape and the slot count only, so it is bitwise repeatable.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

namespace fastops::depthwise_wgrad {

constexpr int64_t kGroupRows = 64;  // slots added per thread in the first reduction stage

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T val[V];
};

struct NhwcArgs {
  const void* x;  // (N, H, W, C), T
  const void* g;  // (N, OH, OW, C), T
  float* ws;      // (slots, C, taps + 1)
  int64_t N, H, W, C, OH, OW;
  int sh, sw, pt, pl, dh, dw;
  int64_t rows_per_slot, slots;
};

// One output row of a task at unit stride and dilation along the row (sw = dw = 1): pixel ow reads input
// columns ow - pl .. ow - pl + K - 1, so each column enters the thread's window once: one x load per
// pixel instead of K (3x3: 2 loads a pixel with g's instead of 4). The taps
// outside the image are skipped, and every sum adds its products in the same order as the general
// path, so the results are bitwise the same.
template <typename T, int V, int K>
C10_HOST_DEVICE inline void nhwc_row_unit_stride(const T* g_row, const T* x_row, int OW, int W, int Ci, int pl,
                                                 bool with_bias, float (&acc)[K][V], float (&bias)[V]) {
  // window[kw]: input column ow - pl + kw where it is inside the image, kept as loaded (16 bytes, 4
  // registers whatever T) and converted at each use: fp32 copies would double the registers of a
  // half-precision 7x7 window and halve the blocks an SM holds.
  Vec<T, V> window[K] = {};
#pragma unroll
  for (int kw = 0; kw + 1 < K; ++kw) {
    const int iw = kw - pl;
    if (static_cast<unsigned>(iw) < static_cast<unsigned>(W)) {
      window[kw + 1] = *reinterpret_cast<const Vec<T, V>*>(x_row + iw * Ci);
    }
  }
  int g_off = 0;
#pragma unroll 1
  for (int ow = 0; ow < OW; ++ow, g_off += Ci) {
#pragma unroll
    for (int kw = 0; kw + 1 < K; ++kw) window[kw] = window[kw + 1];
    const int iw_new = ow - pl + K - 1;
    if (static_cast<unsigned>(iw_new) < static_cast<unsigned>(W)) {
      window[K - 1] = *reinterpret_cast<const Vec<T, V>*>(x_row + iw_new * Ci);
    }
    const Vec<T, V> gv = *reinterpret_cast<const Vec<T, V>*>(g_row + g_off);
    float gf[V];
#pragma unroll
    for (int j = 0; j < V; ++j) gf[j] = static_cast<float>(gv.val[j]);
    if (with_bias) {
#pragma unroll
      for (int j = 0; j < V; ++j) bias[j] += gf[j];
    }
#pragma unroll
    for (int kw = 0; kw < K; ++kw) {
      if (static_cast<unsigned>(ow - pl + kw) >= static_cast<unsigned>(W)) continue;
#pragma unroll
      for (int j = 0; j < V; ++j) acc[kw][j] += gf[j] * static_cast<float>(window[kw].val[j]);
    }
  }
}

// Task `task` (slot = task / (C / V), cv = task % (C / V)) for kernel row kh; K x K taps.
template <typename T, int V, int K>
C10_HOST_DEVICE inline void nhwc_task(const NhwcArgs& a, int64_t task, int kh) {
  const int64_t cvs = a.C / V;
  const int64_t slot = task / cvs;
  const int64_t c0 = (task - slot * cvs) * V;
  const int64_t rows = a.N * a.OH;
  const int64_t r_begin = slot * a.rows_per_slot;
  const int64_t r_end = r_begin + a.rows_per_slot < rows ? r_begin + a.rows_per_slot : rows;
  const T* x = static_cast<const T*>(a.x) + c0;
  const T* g = static_cast<const T*>(a.g) + c0;
  float acc[K][V];
  float bias[V];
#pragma unroll
  for (int kw = 0; kw < K; ++kw) {
#pragma unroll
    for (int j = 0; j < V; ++j) acc[kw][j] = 0.f;
  }
#pragma unroll
  for (int j = 0; j < V; ++j) bias[j] = 0.f;
  // Within a row: 32-bit pixel coordinates and element offsets (the host takes this path only for rows
  // of W * C < 2^31 elements), the bounds test as one unsigned compare.
  const int W = static_cast<int>(a.W), OW = static_cast<int>(a.OW), Ci = static_cast<int>(a.C);
  const int sw = a.sw, pl = a.pl;
  // The sliding window where it also saves registers (sm_90, nvcc 13): fp32 3x3 64 -> 54, 5x5 78 -> 72.
  // For fp32 7x7 (72 -> 93) and fp16/bf16 (3x3 72 -> 77-91, 7x7 114 -> 128-154) it would cost
  // resident blocks, so those keep the general path.
  constexpr bool kWindow = sizeof(T) == 4 && K <= 5;
  const bool unit_stride = kWindow && sw == 1 && a.dw == 1;
  int tap_dw[K];
#pragma unroll
  for (int kw = 0; kw < K; ++kw) tap_dw[kw] = kw * a.dw;
  for (int64_t r = r_begin; r < r_end; ++r) {
    const int64_t n = r / a.OH;
    const int64_t oh = r - n * a.OH;
    const T* g_row = g + r * a.OW * a.C;
    const int64_t ih = oh * a.sh - a.pt + static_cast<int64_t>(kh) * a.dh;
    const bool row_in = ih >= 0 && ih < a.H;
    if (!row_in && kh != 0) continue;  // kh = 0 still sums g for the bias
    const T* x_row = row_in ? x + (n * a.H + ih) * a.W * a.C : x;
    if (row_in && unit_stride) {
      nhwc_row_unit_stride<T, V, K>(g_row, x_row, OW, W, Ci, pl, kh == 0, acc, bias);
      continue;
    }
    int g_off = 0;
    for (int ow = 0; ow < OW; ++ow, g_off += Ci) {
      const Vec<T, V> gv = *reinterpret_cast<const Vec<T, V>*>(g_row + g_off);
      float gf[V];
#pragma unroll
      for (int j = 0; j < V; ++j) gf[j] = static_cast<float>(gv.val[j]);
      if (kh == 0) {
#pragma unroll
        for (int j = 0; j < V; ++j) bias[j] += gf[j];
      }
      if (!row_in) continue;
      const int iw0 = ow * sw - pl;
#pragma unroll
      for (int kw = 0; kw < K; ++kw) {
        const int iw = iw0 + tap_dw[kw];
        if (static_cast<unsigned>(iw) >= static_cast<unsigned>(W)) continue;
        const Vec<T, V> xv = *reinterpret_cast<const Vec<T, V>*>(x_row + iw * Ci);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[kw][j] += gf[j] * static_cast<float>(xv.val[j]);
      }
    }
  }
  constexpr int kTaps = K * K;
  float* out = a.ws + (slot * a.C + c0) * (kTaps + 1);
#pragma unroll
  for (int j = 0; j < V; ++j) {
#pragma unroll
    for (int kw = 0; kw < K; ++kw) out[j * (kTaps + 1) + kh * K + kw] = acc[kw][j];
    if (kh == 0) out[j * (kTaps + 1) + kTaps] = bias[j];
  }
}

// First reduction stage: out[group][i] = ws[group * kGroupRows][i] + ... (the group's slots in order),
// for i < width; `slots` rows of `width` floats in ws.
C10_HOST_DEVICE inline void sum_slot_group(const float* ws, float* out, int64_t slots, int64_t width, int64_t group,
                                           int64_t i) {
  const int64_t first = group * kGroupRows;
  const int64_t last = first + kGroupRows < slots ? first + kGroupRows : slots;
  float sum = 0.f;
  for (int64_t s = first; s < last; ++s) sum += ws[s * width + i];
  out[group * width + i] = sum;
}

}  // namespace fastops::depthwise_wgrad
