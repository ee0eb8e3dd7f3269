// depthwise_conv2d on CUDA: forward, input gradient, weight + bias gradient; NCHW and NHWC.
//   forward:  y[n,c,oh,ow] = b[c] + sum_{kh,kw} w[c,kh,kw] * x[n,c, oh*sh + kh*dh - pt, ow*sw + kw*dw - pl]
//   dgrad:    dx[n,c,ih,iw] = sum over taps whose window covers (ih, iw) of w[c,kh,kw] * g[n,c,oh,ow]
//   wgrad:    dw[c,kh,kw] = sum_{n,oh,ow} g * x;  db[c] = sum g
// Math and accumulation in fp32 for fp16/bf16/fp32. 64-bit indexing; current stream; device guard.
//
// Forward / dgrad, NHWC with C a multiple of the vector width and 16-byte aligned tensors (the
// common case): one thread per 16 bytes of channels (4 fp32 / 8 fp16|bf16) of one pixel, so every
// tap is one 16-byte load and the index arithmetic is paid once per vector, not once per element;
// weights are transposed to [taps][C] fp32 so a tap's weights for the vector are 16-byte loads too.
// Fully unrolled bodies for 3x3, 5x5, 7x7; the dgrad has a stride-1 body without the phase test.
// Otherwise: one thread per output (input) element, consecutive threads on the innermost
// dimension of the layout (ow for NCHW, c for NHWC) so loads and stores coalesce. The forward has
// fully unrolled bodies for 3x3, 5x5 and 7x7 and a generic loop for other kernels; the dgrad is a
// gather (taps whose stride phase matches), never an atomic scatter.
// Weight gradient, NHWC with C a multiple of the vector width, 16-byte aligned, 3x3/5x5/7x7 (the common
// case): fastops/depthwise_wgrad_nhwc.h, shared with a host test: a task is a run of output rows x
// one channel vector, its K threads (one per kernel row) keep K x V tap sums in registers over the
// run, and the runs' partials are added in a fixed two-stage order.
// Otherwise: the N*OH*OW positions of each channel are cut into a fixed number of fixed-size
// partitions (a function of the shape only). One block per (partition, channel [group], tap group)
// reads each (g, x) pair once, keeps up to 25 tap sums + the bias sum in registers, reduces them in
// a fixed tree (warp shuffles, then shared memory) and writes per-partition partials to a
// workspace; a second kernel adds the partials in partition order. No atomics: bitwise repeatable.
// Bytes: forward reads x, writes y; dgrad reads g, writes dx; wgrad reads x and g once (for up to
// 5x5; 7x7 reads them twice, once per tap group) plus a workspace of P*C*(taps+1) floats.
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/flip.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fastops/checks.h>
#include <fastops/depthwise.h>
#include <fastops/depthwise_rows_nhwc.h>
#include <fastops/depthwise_wgrad_nhwc.h>
#include <torch/library.h>

#include <fastops/fast_divmod.h>
#include <fastops/cuda_common.cuh>

#include <algorithm>
#include <optional>
#include <type_traits>

namespace fastops::cuda {
namespace {

constexpr const char* kOp = "depthwise_conv2d";

constexpr int kMaxTaps = 25;  // tap sums per wgrad block (kernels above 5x5 use several tap groups)

struct Geo {
  int64_t N, C, H, W, OH, OW;
  int KH, KW, sh, sw, pt, pl, dh, dw;
};

Geo to_geo(const DepthwiseGeometry& g) {
  return Geo{g.N,
             g.C,
             g.H,
             g.W,
             g.OH,
             g.OW,
             static_cast<int>(g.KH),
             static_cast<int>(g.KW),
             static_cast<int>(g.sh),
             static_cast<int>(g.sw),
             static_cast<int>(g.pt),
             static_cast<int>(g.pl),
             static_cast<int>(g.dh),
             static_cast<int>(g.dw)};
}

// Element (n, c, h, w) of a (N, C, Hd, Wd) tensor in either layout.
template <bool CL>
__device__ __forceinline__ int64_t at4(int64_t n, int64_t c, int64_t h, int64_t w, int64_t C, int64_t Hd, int64_t Wd) {
  return CL ? ((n * Hd + h) * Wd + w) * C + c : ((n * C + c) * Hd + h) * Wd + w;
}

// Splits a linear thread index into (n, c, h, w) with the layout's innermost dimension fastest.
template <bool CL>
__device__ __forceinline__ void split4(int64_t i, int64_t C, int64_t Hd, int64_t Wd, int64_t& n, int64_t& c, int64_t& h,
                                       int64_t& w) {
  if (CL) {
    c = i % C;
    i /= C;
    w = i % Wd;
    i /= Wd;
    h = i % Hd;
    n = i / Hd;
  } else {
    w = i % Wd;
    i /= Wd;
    h = i % Hd;
    i /= Hd;
    c = i % C;
    n = i / C;
  }
}

// K > 0: a KxK kernel known at compile time (fully unrolled); K == 0: any KH x KW.
template <typename T, int K, bool CL>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(const T* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b, T* __restrict__ y,
                   Geo g, int64_t total) {
  const int KH = K > 0 ? K : g.KH, KW = K > 0 ? K : g.KW;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, oh, ow;
    split4<CL>(i, g.C, g.OH, g.OW, n, c, oh, ow);
    const int64_t ih0 = oh * g.sh - g.pt, iw0 = ow * g.sw - g.pl;
    const float* wc = w + c * KH * KW;
    float acc = b ? b[c] : 0.f;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {
      const int64_t ih = ih0 + static_cast<int64_t>(kh) * g.dh;
      if (ih < 0 || ih >= g.H) continue;
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {
        const int64_t iw = iw0 + static_cast<int64_t>(kw) * g.dw;
        if (iw < 0 || iw >= g.W) continue;
        acc += wc[kh * KW + kw] * static_cast<float>(x[at4<CL>(n, c, ih, iw, g.C, g.H, g.W)]);
      }
    }
    y[i] = static_cast<T>(acc);
  }
}

template <typename T, bool CL>
__global__ void __launch_bounds__(kThreads) backward_input_kernel(const T* __restrict__ go, const float* __restrict__ w,
                                                                  T* __restrict__ dx, Geo g, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, ih, iw;
    split4<CL>(i, g.C, g.H, g.W, n, c, ih, iw);
    const float* wc = w + c * g.KH * g.KW;
    float acc = 0.f;
    for (int kh = 0; kh < g.KH; ++kh) {
      const int64_t th = ih + g.pt - static_cast<int64_t>(kh) * g.dh;
      if (th < 0 || th % g.sh != 0) continue;
      const int64_t oh = th / g.sh;
      if (oh >= g.OH) continue;
      for (int kw = 0; kw < g.KW; ++kw) {
        const int64_t tw = iw + g.pl - static_cast<int64_t>(kw) * g.dw;
        if (tw < 0 || tw % g.sw != 0) continue;
        const int64_t ow = tw / g.sw;
        if (ow >= g.OW) continue;
        acc += wc[kh * g.KW + kw] * static_cast<float>(go[at4<CL>(n, c, oh, ow, g.C, g.OH, g.OW)]);
      }
    }
    dx[i] = static_cast<T>(acc);
  }
}

// The pieces the two NHWC vector kernels share. Vector index i of an (N, Hd, Wd, C) NHWC tensor with
// V channels a vector -> (n, h, w, first channel c), by the dividers of IndexDivider (FastDivmod's
// multiply and shift below 2^31 vectors, where 64-bit / and % are a subroutine call each on the GPU).
struct NhwcSplit {
  IndexDivider channel_vectors, width, height;  // C / V, Wd, Hd
};

inline NhwcSplit nhwc_split(int64_t vectors, int64_t channel_vectors, int64_t width, int64_t height) {
  return {IndexDivider(channel_vectors, vectors), IndexDivider(width, vectors), IndexDivider(height, vectors)};
}

template <int V>
__device__ __forceinline__ void split_nhwc_vector(int64_t i, const NhwcSplit& split, int64_t& n, int64_t& h, int64_t& w,
                                                  int64_t& c) {
  const int64_t pixel = split.channel_vectors.div(i);
  const int64_t row = split.width.div(pixel);
  n = split.height.div(row);
  c = (i - pixel * split.channel_vectors.divisor) * V;
  w = pixel - row * split.width.divisor;
  h = row - n * split.height.divisor;
}

// acc[j] += wp[j] * src[j] for the V channels of one tap (src: 16 bytes, wp: V fp32 weights).
template <typename T, int V>
__device__ __forceinline__ void accumulate_tap(float (&acc)[V], const T* src, const float* wp) {
  const Vector<T, V> v = *reinterpret_cast<const Vector<T, V>*>(src);
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] += wp[j] * static_cast<float>(v.val[j]);
}

template <typename T, int V>
__device__ __forceinline__ void store_vector(T* dst, const float (&acc)[V]) {
  Vector<T, V> out;
#pragma unroll
  for (int j = 0; j < V; ++j) out.val[j] = static_cast<T>(acc[j]);
  *reinterpret_cast<Vector<T, V>*>(dst) = out;
}

// NHWC, V channels per thread (16 bytes). wt: weights as [KH*KW][C] fp32. K > 0: KxK at compile
// time; K == 0: any KH x KW.
template <typename T, int V, int K>
__global__ void __launch_bounds__(kThreads)
    forward_nhwc_vec_kernel(const T* __restrict__ x, const float* __restrict__ wt, const float* __restrict__ b,
                            T* __restrict__ y, Geo g, int64_t total_vectors, NhwcSplit split) {
  const int KH = K > 0 ? K : g.KH, KW = K > 0 ? K : g.KW;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total_vectors;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, oh, ow, c;
    split_nhwc_vector<V>(i, split, n, oh, ow, c);
    const int64_t ih0 = oh * g.sh - g.pt, iw0 = ow * g.sw - g.pl;
    const T* xn = x + n * g.H * g.W * g.C + c;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = b ? b[c + j] : 0.f;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {
      const int64_t ih = ih0 + static_cast<int64_t>(kh) * g.dh;
      if (ih < 0 || ih >= g.H) continue;
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {
        const int64_t iw = iw0 + static_cast<int64_t>(kw) * g.dw;
        if (iw < 0 || iw >= g.W) continue;
        accumulate_tap<T, V>(acc, xn + (ih * g.W + iw) * g.C, wt + static_cast<int64_t>(kh * KW + kw) * g.C + c);
      }
    }
    store_vector<T, V>(y + i * V, acc);
  }
}

// NHWC input gradient, V channels per thread: a gather over the taps whose window covers the input
// pixel. S: the stride in both directions at compile time (1: no phase test, no division; 2: the phase
// test and the division are a bit test and a shift, where a run-time stride makes each a 64-bit
// subroutine call, per tap), or 0: the run-time strides of g.
template <typename T, int V, int K, int S>
__global__ void __launch_bounds__(kThreads)
    backward_input_nhwc_vec_kernel(const T* __restrict__ go, const float* __restrict__ wt, T* __restrict__ dx, Geo g,
                                   int64_t total_vectors, NhwcSplit split) {
  const int KH = K > 0 ? K : g.KH, KW = K > 0 ? K : g.KW;
  const int64_t sh = S > 0 ? S : g.sh, sw = S > 0 ? S : g.sw;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total_vectors;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, ih, iw, c;
    split_nhwc_vector<V>(i, split, n, ih, iw, c);
    const T* gn = go + n * g.OH * g.OW * g.C + c;
    float acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.f;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {
      int64_t oh = ih + g.pt - static_cast<int64_t>(kh) * g.dh;
      if (oh < 0) continue;
      if (S != 1) {
        if (oh % sh != 0) continue;
        oh /= sh;
      }
      if (oh >= g.OH) continue;
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {
        int64_t ow = iw + g.pl - static_cast<int64_t>(kw) * g.dw;
        if (ow < 0) continue;
        if (S != 1) {
          if (ow % sw != 0) continue;
          ow /= sw;
        }
        if (ow >= g.OW) continue;
        accumulate_tap<T, V>(acc, gn + (oh * g.OW + ow) * g.C, wt + static_cast<int64_t>(kh * KW + kw) * g.C + c);
      }
    }
    store_vector<T, V>(dx + i * V, acc);
  }
}

namespace dwr = fastops::depthwise_rows;

// Row blocks of kPixels outputs x one channel vector per task (fastops/depthwise_rows_nhwc.h).
template <typename T, int V, int K, int S>
__global__ void __launch_bounds__(kThreads) rows_nhwc_kernel(const dwr::Args a, int64_t tasks) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < tasks;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dwr::task<T, V, K, S, dwr::kPixels>(a, t);
  }
}

// Picks the compile-time kernel size body: 3, 5, 7 (square) or 0 (generic).
inline int square_kernel_size(const DepthwiseGeometry& dg) {
  return dg.KH == dg.KW && (dg.KH == 3 || dg.KH == 5 || dg.KH == 7) ? static_cast<int>(dg.KH) : 0;
}

template <int... Ks, typename F>
void with_kernel_size(int k, F&& f) {
  bool done = ((k == Ks ? (f(std::integral_constant<int, Ks>{}), true) : false) || ...);
  if (!done) f(std::integral_constant<int, 0>{});
}

// The row-block kernel for a forward (stride s) or a stride-1 input gradient (in = g, the taps of wt
// flipped, pads K - 1 - pad): square k = 3, 5, 7, dilation 1, s = 1 or 2, rows of IW * C < 2^31.
template <typename T>
void launch_rows_nhwc(const dwr::Args& a, int k, int s, cudaStream_t stream) {
  constexpr int V = kVectorWidth<T>;
  const int64_t tasks = a.N * a.OH * dwr::row_blocks<dwr::kPixels>(a.OW) * (a.C / V);
  with_kernel_size<3, 5, 7>(k, [&](auto kc) {
    constexpr int K = decltype(kc)::value;
    if constexpr (K > 0) {
      const auto kernel = s == 1 ? rows_nhwc_kernel<T, V, K, 1> : rows_nhwc_kernel<T, V, K, 2>;
      kernel<<<grid_stride_blocks(tasks), kThreads, 0, stream>>>(a, tasks);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

// The row-block kernel's arguments: a forward reads x (H x W) into y (OH x OW); the stride-1 input
// gradient reads g (OH x OW) into dx (H x W) with the flipped kernel's pads K - 1 - pad.
inline dwr::Args rows_args(const DepthwiseGeometry& dg, bool input_grad, const void* in, const float* wt,
                           const float* bias, void* out) {
  dwr::Args a{};
  a.in = in;
  a.wt = wt;
  a.bias = bias;
  a.out = out;
  a.N = dg.N;
  a.C = dg.C;
  a.IH = input_grad ? dg.OH : dg.H;
  a.IW = input_grad ? dg.OW : dg.W;
  a.OH = input_grad ? dg.H : dg.OH;
  a.OW = input_grad ? dg.W : dg.OW;
  a.pt = static_cast<int>(input_grad ? dg.KH - 1 - dg.pt : dg.pt);
  a.pl = static_cast<int>(input_grad ? dg.KW - 1 - dg.pl : dg.pl);
  return a;
}

// Whether the row-block kernel takes this shape: equal strides up to max_stride (the forward 2, the
// input gradient 1), rows of in_w * C < 2^31 elements.
inline bool rows_nhwc_fit(const DepthwiseGeometry& dg, int64_t in_w, int64_t max_stride) {
  return square_kernel_size(dg) > 0 && dg.dh == 1 && dg.dw == 1 && dg.sh == dg.sw && dg.sh <= max_stride &&
         in_w * dg.C < (int64_t{1} << 31);
}

// Weight gradient partials. NCHW: block = 256 threads on one channel (blockIdx.y), consecutive
// threads on consecutive positions. NHWC: block = 32 channels (threadIdx.x) x 8 position lanes
// (threadIdx.y). blockIdx.x = partition, blockIdx.z = tap group. Partial sums go to
// ws[((part * C + c) * (taps + 1)) + tap] (the last slot: bias, written by tap group 0 only).
template <typename T, bool CL>
__global__ void __launch_bounds__(kThreads)
    backward_weight_partial_kernel(const T* __restrict__ go, const T* __restrict__ x, float* __restrict__ ws, Geo g,
                                   int64_t positions, int64_t per_part) {
  __shared__ float red[kThreads];
  const int taps = g.KH * g.KW;
  const int t0 = blockIdx.z * kMaxTaps;
  const int nt = min(kMaxTaps, taps - t0);
  const int lanes = CL ? blockDim.y : blockDim.x;
  const int lane = CL ? threadIdx.y : threadIdx.x;
  const int64_t c = CL ? static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x : blockIdx.y;
  const bool active = c < g.C;
  const int64_t begin = blockIdx.x * per_part, end = min(positions, begin + per_part);
  float acc[kMaxTaps];
  float bacc = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxTaps; ++j) acc[j] = 0.f;
  if (active) {
    for (int64_t p = begin + lane; p < end; p += lanes) {
      const int64_t ow = p % g.OW, oh = (p / g.OW) % g.OH, n = p / (g.OW * g.OH);
      const float gv = static_cast<float>(go[at4<CL>(n, c, oh, ow, g.C, g.OH, g.OW)]);
      bacc += gv;
      const int64_t ih0 = oh * g.sh - g.pt, iw0 = ow * g.sw - g.pl;
#pragma unroll
      for (int j = 0; j < kMaxTaps; ++j) {
        if (j < nt) {
          const int t = t0 + j;
          const int64_t ih = ih0 + static_cast<int64_t>(t / g.KW) * g.dh;
          const int64_t iw = iw0 + static_cast<int64_t>(t % g.KW) * g.dw;
          if (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) {
            acc[j] += gv * static_cast<float>(x[at4<CL>(n, c, ih, iw, g.C, g.H, g.W)]);
          }
        }
      }
    }
  }
  // Fixed-order reduction over the position lanes of the block, one tap at a time.
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  auto reduce = [&](float v) -> float {
    red[tid] = v;
    __syncthreads();
    if (CL) {  // over threadIdx.y (8 lanes), per channel threadIdx.x
      if (threadIdx.y == 0) {
        float s = 0.f;
        for (int l = 0; l < lanes; ++l) s += red[l * blockDim.x + threadIdx.x];
        v = s;
      }
    } else {  // over all 256 threads: a fixed tree
      for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
        if (tid < stride) red[tid] += red[tid + stride];
        __syncthreads();
      }
      v = red[0];
    }
    __syncthreads();
    return v;
  };
  const bool writer = CL ? (threadIdx.y == 0 && active) : tid == 0;
  float* out = ws + (static_cast<int64_t>(blockIdx.x) * g.C + c) * (taps + 1);
  for (int j = 0; j < nt; ++j) {
    const float s = reduce(acc[j]);
    if (writer) out[t0 + j] = s;
  }
  if (blockIdx.z == 0) {
    const float s = reduce(bacc);
    if (writer) out[taps] = s;
  }
}

namespace dwg = fastops::depthwise_wgrad;

// Block: 32 tasks (threadIdx.x) x the K kernel rows (threadIdx.y).
template <typename T, int V, int K>
__global__ void __launch_bounds__(32 * 7) backward_weight_nhwc_vec_kernel(const dwg::NhwcArgs a, int64_t tasks) {
  const int64_t task = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (task < tasks) dwg::nhwc_task<T, V, K>(a, task, static_cast<int>(threadIdx.y));
}

__global__ void __launch_bounds__(kThreads)
    backward_weight_slot_groups_kernel(const float* __restrict__ ws, float* __restrict__ out, int64_t slots,
                                       int64_t width, int64_t groups) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < groups * width;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t group = k / width;
    dwg::sum_slot_group(ws, out, slots, width, group, k - group * width);
  }
}

// Writes the summed partials, element i = c * (taps + 1) + k of a (C, taps + 1) row: the tap sums to
// dw[c][k], the last slot to db[c].
template <typename T>
struct StoreWeightAndBias {
  T* dw;
  T* db;
  int taps;
  __device__ void operator()(int64_t i, float sum) const {
    const int64_t c = i / (taps + 1);
    const int k = static_cast<int>(i % (taps + 1));
    if (k < taps) {
      dw[c * taps + k] = static_cast<T>(sum);
    } else {
      db[c] = static_cast<T>(sum);
    }
  }
};

void check_geo_fits(const DepthwiseGeometry& g) {
  // Kernel sizes, strides, pads and dilations are held in 32 bits on the device.
  const int64_t lim = int64_t{1} << 30;
  TORCH_CHECK(
      g.KH < lim && g.KW < lim && g.sh < lim && g.sw < lim && g.pt < lim && g.pl < lim && g.dh < lim && g.dw < lim,
      "fastops.depthwise_conv2d: kernel, stride, padding and dilation must be below 2^30 on CUDA");
}

at::Tensor depthwise_conv2d(const at::Tensor& x_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  check_depthwise_inputs(x_in, weight, bias);
  const DepthwiseGeometry dg =
      make_depthwise_geometry(kOp, x_in.sizes(), weight.size(2), weight.size(3), stride, padding, dilation);
  check_geo_fits(dg);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const bool cl = use_channels_last(x_in);
  const auto fmt = cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor x = x_in.contiguous(fmt);
  at::Tensor y = at::empty({dg.N, dg.C, dg.OH, dg.OW}, x.options().memory_format(fmt));
  const int64_t total = y.numel();
  if (total == 0) return y;
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  const at::Tensor b = bias.has_value() && bias->defined() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const Geo g = to_geo(dg);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int k = square_kernel_size(dg);
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_depthwise_conv2d_cuda", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const float* wp = w.const_data_ptr<float>();
    const float* bp = b.defined() ? b.const_data_ptr<float>() : nullptr;
    scalar_t* yp = y.data_ptr<scalar_t>();
    if (cl && vectorizable<scalar_t>(dg.C, {xp, yp})) {
      constexpr int V = kVectorWidth<scalar_t>;
      const at::Tensor wt = w.view({dg.C, dg.taps()}).t().contiguous();
      if (rows_nhwc_fit(dg, dg.W, 2)) {
        const dwr::Args a = rows_args(dg, false, xp, wt.const_data_ptr<float>(), bp, yp);
        launch_rows_nhwc<scalar_t>(a, k, static_cast<int>(dg.sh), stream);
        return;
      }
      const int64_t vectors = total / V;
      const NhwcSplit split = nhwc_split(vectors, dg.C / V, dg.OW, dg.OH);
      with_kernel_size<3, 5, 7>(k, [&](auto kc) {
        forward_nhwc_vec_kernel<scalar_t, V, decltype(kc)::value><<<grid_stride_blocks(vectors), kThreads, 0, stream>>>(
            xp, wt.const_data_ptr<float>(), bp, yp, g, vectors, split);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
      return;
    }
    with_kernel_size<3, 5, 7>(k, [&](auto kc) {
      constexpr int K = decltype(kc)::value;
      const auto kernel = cl ? forward_kernel<scalar_t, K, true> : forward_kernel<scalar_t, K, false>;
      kernel<<<grid_stride_blocks(total), kThreads, 0, stream>>>(xp, wp, bp, yp, g, total);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return y;
}

at::Tensor depthwise_conv2d_backward_input(const at::Tensor& grad_in, const at::Tensor& weight,
                                           c10::SymIntArrayRef input_size_sym, at::IntArrayRef stride,
                                           at::IntArrayRef padding, at::IntArrayRef dilation, bool channels_last) {
  const at::IntArrayRef input_size = C10_AS_INTARRAYREF_SLOW(input_size_sym);
  const DepthwiseGeometry dg = check_depthwise_backward_input(grad_in, weight, input_size, stride, padding, dilation);
  check_geo_fits(dg);
  const c10::cuda::CUDAGuard guard(grad_in.device());
  const auto fmt = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor go = grad_in.contiguous(fmt);
  at::Tensor dx = at::empty(input_size, go.options().memory_format(fmt));
  const int64_t total = dx.numel();
  if (total == 0) return dx;
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  const Geo g = to_geo(dg);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(go.scalar_type(), "fastops_depthwise_dgrad_cuda", [&] {
    const scalar_t* gp = go.const_data_ptr<scalar_t>();
    const float* wp = w.const_data_ptr<float>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    if (channels_last && vectorizable<scalar_t>(dg.C, {gp, dxp})) {
      constexpr int V = kVectorWidth<scalar_t>;
      const int k = square_kernel_size(dg);
      if (rows_nhwc_fit(dg, dg.OW, 1)) {
        // A stride-1 forward of g with the kernel flipped (fastops/depthwise_rows_nhwc.h).
        const at::Tensor wt_flipped = w.view({dg.C, dg.taps()}).flip({1}).t().contiguous();
        const dwr::Args a = rows_args(dg, true, gp, wt_flipped.const_data_ptr<float>(), nullptr, dxp);
        launch_rows_nhwc<scalar_t>(a, k, 1, stream);
        return;
      }
      const at::Tensor wt = w.view({dg.C, dg.taps()}).t().contiguous();
      const int64_t vectors = total / V;
      const NhwcSplit split = nhwc_split(vectors, dg.C / V, dg.W, dg.H);
      const int s = dg.sh == dg.sw && (dg.sh == 1 || dg.sh == 2) ? static_cast<int>(dg.sh) : 0;
      with_kernel_size<3, 5, 7>(square_kernel_size(dg), [&](auto kc) {
        constexpr int K = decltype(kc)::value;
        const float* wtp = wt.const_data_ptr<float>();
        const auto blocks = grid_stride_blocks(vectors);
        if (s == 1) {
          backward_input_nhwc_vec_kernel<scalar_t, V, K, 1>
              <<<blocks, kThreads, 0, stream>>>(gp, wtp, dxp, g, vectors, split);
        } else if (s == 2) {
          backward_input_nhwc_vec_kernel<scalar_t, V, K, 2>
              <<<blocks, kThreads, 0, stream>>>(gp, wtp, dxp, g, vectors, split);
        } else {
          backward_input_nhwc_vec_kernel<scalar_t, V, K, 0>
              <<<blocks, kThreads, 0, stream>>>(gp, wtp, dxp, g, vectors, split);
        }
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
      return;
    }
    if (channels_last) {
      backward_input_kernel<scalar_t, true><<<grid_stride_blocks(total), kThreads, 0, stream>>>(gp, wp, dxp, g, total);
    } else {
      backward_input_kernel<scalar_t, false><<<grid_stride_blocks(total), kThreads, 0, stream>>>(gp, wp, dxp, g, total);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return dx;
}

// The NHWC channel-vector weight gradient (see fastops/depthwise_wgrad_nhwc.h); k = 3, 5 or 7.
template <typename T>
void backward_weight_nhwc_vec(const DepthwiseGeometry& dg, int k, const T* gp, const T* xp, at::Tensor& dw,
                              at::Tensor& db, const at::TensorOptions& options, cudaStream_t stream) {
  constexpr int V = kVectorWidth<T>;
  const int64_t taps = dg.taps(), width = dg.C * (taps + 1);
  const int64_t cvs = dg.C / V, rows = dg.N * dg.OH;
  // About two waves of 2048 threads per SM, in runs of whole rows; the workspace within 64 MiB.
  const int64_t want_tasks = 2 * 2048 * static_cast<int64_t>(multiprocessor_count()) / k;
  int64_t slots = std::clamp<int64_t>(want_tasks / cvs, 1, rows);
  slots = std::min<int64_t>(slots, std::max<int64_t>(1, (int64_t{16} << 20) / width));
  const int64_t rows_per_slot = (rows + slots - 1) / slots;
  slots = (rows + rows_per_slot - 1) / rows_per_slot;
  const int64_t groups = (slots + dwg::kGroupRows - 1) / dwg::kGroupRows;
  at::Tensor ws = at::empty({slots, width}, options.dtype(at::kFloat));
  at::Tensor group_sums = at::empty({groups, width}, options.dtype(at::kFloat));
  const dwg::NhwcArgs args{xp,
                           gp,
                           ws.data_ptr<float>(),
                           dg.N,
                           dg.H,
                           dg.W,
                           dg.C,
                           dg.OH,
                           dg.OW,
                           static_cast<int>(dg.sh),
                           static_cast<int>(dg.sw),
                           static_cast<int>(dg.pt),
                           static_cast<int>(dg.pl),
                           static_cast<int>(dg.dh),
                           static_cast<int>(dg.dw),
                           rows_per_slot,
                           slots};
  const int64_t tasks = slots * cvs;
  TORCH_CHECK((tasks + 31) / 32 <= INT32_MAX, "fastops.depthwise_conv2d_backward_weight: too many channels");
  const auto blocks = static_cast<unsigned>((tasks + 31) / 32);
  with_kernel_size<3, 5, 7>(k, [&](auto kc) {
    constexpr int K = decltype(kc)::value;
    if constexpr (K > 0) {
      backward_weight_nhwc_vec_kernel<T, V, K><<<blocks, dim3(32, K), 0, stream>>>(args, tasks);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  backward_weight_slot_groups_kernel<<<grid_stride_blocks(groups * width), kThreads, 0, stream>>>(
      ws.data_ptr<float>(), group_sums.data_ptr<float>(), slots, width, groups);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  launch_sum_rows_in_order(group_sums.data_ptr<float>(), groups, width,
                           StoreWeightAndBias<T>{dw.data_ptr<T>(), db.data_ptr<T>(), static_cast<int>(taps)}, stream);
}

std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_backward_weight(const at::Tensor& grad_in, const at::Tensor& x_in,
                                                                    at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                                                    at::IntArrayRef padding, at::IntArrayRef dilation) {
  const DepthwiseGeometry dg = check_depthwise_backward_weight(grad_in, x_in, kernel_size, stride, padding, dilation);
  check_geo_fits(dg);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const bool cl = use_channels_last(x_in);
  const auto fmt = cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor x = x_in.contiguous(fmt);
  const at::Tensor go = grad_in.contiguous(fmt);
  at::Tensor dw = at::empty({dg.C, 1, dg.KH, dg.KW}, x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor db = at::empty({dg.C}, x.options().memory_format(at::MemoryFormat::Contiguous));
  if (dg.C == 0) return {dw, db};
  const int taps = static_cast<int>(dg.taps());
  const int64_t positions = dg.N * dg.OH * dg.OW;
  // Fixed partition of the positions: ~4096 per partition, at most 1024 partitions.
  constexpr int64_t kPerPart = 4096;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(1024, (positions + kPerPart - 1) / kPerPart));
  const int64_t per_part = std::max<int64_t>(1, (positions + parts - 1) / parts);
  const int tap_groups = (taps + kMaxTaps - 1) / kMaxTaps;
  TORCH_CHECK(tap_groups < 65536,
              "fastops.depthwise_conv2d_backward_weight: kernel too large for the CUDA weight gradient");
  const Geo g = to_geo(dg);
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t channel_blocks = cl ? (dg.C + 31) / 32 : dg.C;
  TORCH_CHECK(channel_blocks < 65536,
              "fastops.depthwise_conv2d_backward_weight: more than 65535 channel blocks is not supported on CUDA");
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_depthwise_wgrad_cuda", [&] {
    const scalar_t* gp = go.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const int k = square_kernel_size(dg);
    // 32-bit offsets within a row (fastops/depthwise_wgrad_nhwc.h): W * C and OW * C below 2^31.
    const bool small_rows = std::max(dg.W, dg.OW) * dg.C < (int64_t{1} << 31);
    if (cl && k > 0 && positions > 0 && small_rows && vectorizable<scalar_t>(dg.C, {gp, xp})) {
      backward_weight_nhwc_vec<scalar_t>(dg, k, gp, xp, dw, db, x.options(), stream);
      return;
    }
    at::Tensor ws = at::empty({parts, dg.C, taps + 1}, x.options().dtype(at::kFloat));
    float* wsp = ws.data_ptr<float>();
    const dim3 grid(static_cast<unsigned>(parts), static_cast<unsigned>(channel_blocks),
                    static_cast<unsigned>(tap_groups));
    if (positions == 0) {
      ws.zero_();
    } else if (cl) {
      backward_weight_partial_kernel<scalar_t, true>
          <<<grid, dim3(32, kThreads / 32), 0, stream>>>(gp, xp, wsp, g, positions, per_part);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    } else {
      backward_weight_partial_kernel<scalar_t, false>
          <<<grid, dim3(kThreads), 0, stream>>>(gp, xp, wsp, g, positions, per_part);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    launch_sum_rows_in_order(wsp, parts, dg.C * (taps + 1),
                             StoreWeightAndBias<scalar_t>{dw.data_ptr<scalar_t>(), db.data_ptr<scalar_t>(), taps},
                             stream);
  });
  return {dw, db};
}

}  // namespace
}  // namespace fastops::cuda

TORCH_LIBRARY_IMPL(fastops, CUDA, m) {
  m.impl("depthwise_conv2d", &fastops::cuda::depthwise_conv2d);
  m.impl("depthwise_conv2d_backward_input", &fastops::cuda::depthwise_conv2d_backward_input);
  m.impl("depthwise_conv2d_backward_weight", &fastops::cuda::depthwise_conv2d_backward_weight);
}
