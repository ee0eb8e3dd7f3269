// The CUDA depthwise forward (stride 1 or 2) and stride-1 input gradient for NHWC tensors whose
// channels split into 16-byte vectors, square 3x3/5x5/7x7 kernels, dilation 1: host+device functions
// that the kernels in csrc/cuda/depthwise_conv2d.cu call, and that tests/ops/test_depthwise_conv2d.py
// runs over the same tasks on the CPU (test_nhwc_row_block_kernel_on_the_host).
//
//   out[n, oh, ow, c] = bias[c] + sum_{kh, kw} wt[kh * K + kw][c] * in[n, oh*S - pt + kh, ow*S - pl + kw, c]
//
// The stride-1 input gradient is this with in = g, out = dx, the taps reversed (wt of the flipped
// kernel) and pt, pl = K - 1 - pt, K - 1 - pl: dx[ih, iw] = sum w[kh, kw] g[ih + pt - kh, iw + pl - kw].
//
// A task is P consecutive output pixels of one row x one channel vector of V channels. Per kernel row
// it loads the row's K weight vectors once and each of the (P - 1) * S + K input columns the P outputs
// touch once, and adds every column into the outputs whose window holds it (which (p, kw) pairs a
// column feeds is known at compile time): 27 loads for 4 outputs of a 3x3 stride-1 kernel, where one
// thread per output pixel loads 72. Consecutive tasks take consecutive channel vectors (coalesced).
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

namespace fastops::depthwise_rows {

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T val[V];
};

struct Args {
  const void* in;     // (N, IH, IW, C), T
  const float* wt;    // (K * K, C): tap-major weights
  const float* bias;  // (C) or null
  void* out;          // (N, OH, OW, C), T
  int64_t N, IH, IW, C, OH, OW;
  int pt, pl;
};

constexpr int kPixels = 4;  // P: output pixels per task

template <int P>
C10_HOST_DEVICE inline int64_t row_blocks(int64_t ow) {
  return (ow + P - 1) / P;
}

// Tasks of a launch: N * OH * row_blocks(OW) * (C / V).
template <typename T, int V, int K, int S, int P>
C10_HOST_DEVICE inline void task(const Args& a, int64_t t) {
  const int64_t cvs = a.C / V, blocks = row_blocks<P>(a.OW);
  const int64_t cv = t % cvs;
  t /= cvs;
  const int64_t b = t % blocks;
  t /= blocks;
  const int64_t oh = t % a.OH;
  const int64_t n = t / a.OH;
  const int64_t c0 = cv * V;
  const int ow0 = static_cast<int>(b) * P;
  const int IW = static_cast<int>(a.IW), Ci = static_cast<int>(a.C);  // the host checks IW * C < 2^31
  float acc[P][V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const float init = a.bias != nullptr ? a.bias[c0 + j] : 0.f;
#pragma unroll
    for (int p = 0; p < P; ++p) acc[p][j] = init;
  }
  const int iw_base = ow0 * S - a.pl;
#pragma unroll 1
  for (int kh = 0; kh < K; ++kh) {
    const int64_t ih = oh * S - a.pt + kh;
    if (ih < 0 || ih >= a.IH) continue;
    const T* in_row = static_cast<const T*>(a.in) + (n * a.IH + ih) * a.IW * a.C + c0;
    float w[K][V];
#pragma unroll
    for (int kw = 0; kw < K; ++kw) {
#pragma unroll
      for (int h = 0; h < V; h += 4) {
        const Vec<float, 4> wv = *reinterpret_cast<const Vec<float, 4>*>(a.wt + (kh * K + kw) * a.C + c0 + h);
#pragma unroll
        for (int j = 0; j < 4; ++j) w[kw][h + j] = wv.val[j];
      }
    }
#pragma unroll
    for (int col = 0; col < (P - 1) * S + K; ++col) {
      const int iw = iw_base + col;
      if (static_cast<unsigned>(iw) >= static_cast<unsigned>(IW)) continue;  // zero padding
      const Vec<T, V> xv = *reinterpret_cast<const Vec<T, V>*>(in_row + iw * Ci);
      float xf[V];
#pragma unroll
      for (int j = 0; j < V; ++j) xf[j] = static_cast<float>(xv.val[j]);
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const int kw = col - p * S;
        if (kw < 0 || kw >= K) continue;  // decided at compile time
#pragma unroll
        for (int j = 0; j < V; ++j) acc[p][j] += w[kw][j] * xf[j];
      }
    }
  }
  T* out = static_cast<T*>(a.out) + ((n * a.OH + oh) * a.OW + ow0) * a.C + c0;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    if (ow0 + p >= a.OW) break;
    Vec<T, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.val[j] = static_cast<T>(acc[p][j]);
    *reinterpret_cast<Vec<T, V>*>(out + static_cast<int64_t>(p) * a.C) = o;
  }
}

}  // namespace fastops::depthwise_rows
