// squeeze_excite on CUDA: the four memory passes of an SE block (math in csrc/cpu/squeeze_excite.cpp's
// header; the tiny FCs between them run in ATen, fastops/ops/squeeze_excite.py).
//   pool:             p[n,c]     = sum_hw x / HW          backward_reduce: ds[n,c] = sum_hw g * x
//   scale:            y          = x * s[n,c]             backward_input:  dx = g * s[n,c] + dp[n,c] / HW
// Strategy, fp32 math and accumulation throughout:
//   NCHW reductions (rows of HW): kRowThreads threads per (n, c) row — a warp for rows shorter than
//     kLongRow, a whole 256-thread block for longer ones — striding the row in 16-byte vectors when
//     HW and the pointers allow, then a shuffle reduction (and one through shared memory across the
//     block's warps). One writer per row, fixed order: bitwise reproducible.
//   NHWC reductions (rows of C per (n, hw)): a 32 x 8 block; threadIdx.x walks vectors of channels
//     (coalesced across the warp), threadIdx.y and blockIdx.z split HW. The 8 rows of a block are
//     added in order through shared memory, each HW split writes one row of fp32 partials, and
//     launch_sum_rows_in_order (cuda_common.cuh) adds the splits in order: no atomics, reproducible.
//   Broadcast passes: one grid-stride loop over 16-byte vectors (when the row length of the layout —
//     HW for NCHW, C for NHWC — is a multiple of the vector width and the pointers are aligned), the
//     per-channel factor loaded per element (NHWC) or once per vector (NCHW, a vector never crosses a
//     row).
// Bytes per element of x: pool sizeof(T), backward_reduce 2 sizeof(T), scale and backward_input
// 2 sizeof(T); at 3 TB/s a 64M-element bf16 scale should take ~0.09 ms.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fastops/checks.h>
#include <fastops/squeeze_excite.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>

#include <fastops/fast_divmod.h>
#include <fastops/cuda_common.cuh>

namespace fastops::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int64_t kLongRow = 4096;  // NCHW rows at least this long get a whole block each
constexpr int kBlockRows = 8;       // NHWC: HW rows per block (threadIdx.y)

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// sum over [0, len) of a[i] (* b[i] with kProduct) by the kRowThreads threads of one row group,
// thread `lane` of them; V elements per load.
template <typename T, int V, bool kProduct>
__device__ float strided_row_sum(const T* __restrict__ a, const T* __restrict__ b, int64_t len, int lane, int threads) {
  using Vec = Vector<T, V>;
  float acc = 0.f;
  for (int64_t i = static_cast<int64_t>(lane) * V; i < len; i += static_cast<int64_t>(threads) * V) {
    const Vec va = *reinterpret_cast<const Vec*>(a + i);
    if constexpr (kProduct) {
      const Vec vb = *reinterpret_cast<const Vec*>(b + i);
#pragma unroll
      for (int k = 0; k < V; ++k) acc += to_float(va.val[k]) * to_float(vb.val[k]);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) acc += to_float(va.val[k]);
    }
  }
  return acc;
}

// NCHW: out[r] = sum over row r (/ divisor); kRowThreads threads per row, kThreads / kRowThreads rows per block.
template <typename T, int V, bool kProduct, int kRowThreads>
__global__ void __launch_bounds__(kThreads)
    nchw_row_sums_kernel(float* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, int64_t rows,
                         int64_t len, float divisor) {
  constexpr int kRowsPerBlock = kThreads / kRowThreads;
  const int group = threadIdx.x / kRowThreads, lane = threadIdx.x % kRowThreads;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + group;
  float sum = 0.f;
  if (r < rows) sum = strided_row_sum<T, V, kProduct>(a + r * len, kProduct ? b + r * len : b, len, lane, kRowThreads);
  sum = warp_sum(sum);
  if constexpr (kRowThreads > kWarp) {
    __shared__ float warp_sums[kThreads / kWarp];
    if (threadIdx.x % kWarp == 0) warp_sums[threadIdx.x / kWarp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.f;
      for (int w = 0; w < kThreads / kWarp; ++w) total += warp_sums[w];
      if (r < rows) out[r] = total / divisor;
    }
  } else {
    if (lane == 0 && r < rows) out[r] = sum / divisor;
  }
}

// NHWC: partial[z, n, c] = sum over the HW rows of split z of a (* b); grid (channel blocks * N, 1, splits)
// (N folded into x: grid.y stops at 65535).
template <typename T, int V, bool kProduct>
__global__ void __launch_bounds__(kThreads)
    nhwc_partial_sums_kernel(float* __restrict__ partial, const T* __restrict__ a, const T* __restrict__ b, int64_t N,
                             int64_t C, int64_t HW, int64_t channel_blocks, int64_t rows_per_split) {
  using Vec = Vector<T, V>;
  __shared__ float block_acc[kBlockRows][kWarp * V];
  const int64_t n = blockIdx.x / channel_blocks;
  const int64_t c0 = ((blockIdx.x % channel_blocks) * kWarp + threadIdx.x) * V;
  const int64_t hw_begin = static_cast<int64_t>(blockIdx.z) * rows_per_split;
  const int64_t hw_end = hw_begin + rows_per_split < HW ? hw_begin + rows_per_split : HW;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = 0.f;
  if (c0 < C) {
    for (int64_t hw = hw_begin + threadIdx.y; hw < hw_end; hw += kBlockRows) {
      const int64_t off = (n * HW + hw) * C + c0;
      const Vec va = *reinterpret_cast<const Vec*>(a + off);
      if constexpr (kProduct) {
        const Vec vb = *reinterpret_cast<const Vec*>(b + off);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += to_float(va.val[k]) * to_float(vb.val[k]);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += to_float(va.val[k]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) block_acc[threadIdx.y][threadIdx.x * V + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c0 < C) {
    float* dst = partial + (static_cast<int64_t>(blockIdx.z) * N + n) * C + c0;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float total = 0.f;
      for (int row = 0; row < kBlockRows; ++row) total += block_acc[row][threadIdx.x * V + k];
      dst[k] = total;
    }
  }
}

// The Store of launch_sum_rows_in_order for the NHWC reductions: the sum over the splits, / divisor.
struct StoreDivided {
  float* out;
  float divisor;
  __device__ void operator()(int64_t i, float sum) const { out[i] = sum / divisor; }
};

// out[n, c] = sum_hw a (* b) / divisor, a and b in the layout of `shape`.
template <typename T, bool kProduct>
void launch_channel_sums(float* out, const T* a, const T* b, const SqueezeExciteShape& shape, float divisor,
                         const at::TensorOptions& float_options, cudaStream_t stream) {
  const int64_t N = shape.N, C = shape.C, HW = shape.HW;
  constexpr int VW = kVectorWidth<T>;
  if (!shape.channels_last) {
    const bool vec = vectorizable<T>(HW, {a, kProduct ? b : a});
    auto launch = [&](auto row_threads, auto width) {
      constexpr int kRowThreads = decltype(row_threads)::value;
      constexpr int kV = decltype(width)::value;
      const int64_t blocks = (N * C + kThreads / kRowThreads - 1) / (kThreads / kRowThreads);
      nchw_row_sums_kernel<T, kV, kProduct, kRowThreads>
          <<<blocks, kThreads, 0, stream>>>(out, a, b, N * C, HW, divisor);
    };
    using Block = std::integral_constant<int, kThreads>;
    using Warp = std::integral_constant<int, kWarp>;
    using Vw = std::integral_constant<int, VW>;
    using One = std::integral_constant<int, 1>;
    if (HW >= kLongRow) {
      vec ? launch(Block{}, Vw{}) : launch(Block{}, One{});
    } else {
      vec ? launch(Warp{}, Vw{}) : launch(Warp{}, One{});
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const bool vec = vectorizable<T>(C, {a, kProduct ? b : a});
  const int V = vec ? VW : 1;
  const int64_t channel_blocks = (C / V + kWarp - 1) / kWarp;
  // Enough HW splits for ~4 blocks per SM, each split at least 64 rows.
  const int64_t want_blocks = 4 * static_cast<int64_t>(multiprocessor_count());
  const int64_t max_splits = std::max<int64_t>(1, HW / 64);
  const int64_t splits = std::clamp<int64_t>(want_blocks / std::max<int64_t>(channel_blocks * N, 1), 1,
                                             std::min<int64_t>(max_splits, 65535));
  const int64_t rows_per_split = (HW + splits - 1) / splits;
  at::Tensor partial = at::empty({splits, N, C}, float_options);
  const dim3 grid(static_cast<unsigned>(channel_blocks * N), 1, static_cast<unsigned>(splits));
  const dim3 block(kWarp, kBlockRows);
  if (vec) {
    nhwc_partial_sums_kernel<T, VW, kProduct>
        <<<grid, block, 0, stream>>>(partial.data_ptr<float>(), a, b, N, C, HW, channel_blocks, rows_per_split);
  } else {
    nhwc_partial_sums_kernel<T, 1, kProduct>
        <<<grid, block, 0, stream>>>(partial.data_ptr<float>(), a, b, N, C, HW, channel_blocks, rows_per_split);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  launch_sum_rows_in_order(partial.data_ptr<float>(), splits, N * C, StoreDivided{out, divisor}, stream);
}

// Where vector v of an affine pass takes its factor: s[row] for NCHW (row = v / vectors_per_row), s[n * C
// + c] for channels_last (c = (v % channel_vectors) * V, n = v / (HW * channel_vectors)), by the
// dividers of IndexDivider (FastDivmod below 2^31 vectors, where 64-bit / and % are a subroutine call
// each on the GPU).
struct AffineIndex {
  IndexDivider inner, outer;  // NCHW: vectors per row; CL: channel vectors, and vectors per image
  int64_t C;

  template <int V>
  __device__ __forceinline__ int64_t factor_index(int64_t v, bool channels_last) const {
    return channels_last ? outer.div(v) * C + inner.mod(v) * V : inner.div(v);
  }
};

// out = a * s[n, c] (+ d[n, c] with kShift), over `vectors` vectors of V elements.
template <typename T, int V, bool kChannelsLast, bool kShift>
__global__ void __launch_bounds__(kThreads)
    channel_affine_kernel(T* __restrict__ out, const T* __restrict__ a, const float* __restrict__ s,
                          const float* __restrict__ d, int64_t vectors, AffineIndex index) {
  using Vec = Vector<T, V>;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = v * V;
    const Vec va = *reinterpret_cast<const Vec*>(a + i);
    const int64_t f = index.factor_index<V>(v, kChannelsLast);
    Vec vo;
    if constexpr (kChannelsLast) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float x = to_float(va.val[k]);
        vo.val[k] = static_cast<T>(kShift ? fmaf(x, s[f + k], d[f + k]) : x * s[f + k]);
      }
    } else {
      const float sv = s[f], dv = kShift ? d[f] : 0.f;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float x = to_float(va.val[k]);
        vo.val[k] = static_cast<T>(kShift ? fmaf(x, sv, dv) : x * sv);
      }
    }
    *reinterpret_cast<Vec*>(out + i) = vo;
  }
}

template <typename T, bool kShift>
void launch_channel_affine(T* out, const T* a, const float* s, const float* d, const SqueezeExciteShape& shape,
                           cudaStream_t stream) {
  const int64_t numel = shape.N * shape.C * shape.HW;
  const int64_t row = shape.channels_last ? shape.C : shape.HW;
  constexpr int VW = kVectorWidth<T>;
  const bool vec = vectorizable<T>(row, {out, a});
  auto launch = [&](auto channels_last, auto width) {
    constexpr bool kCl = decltype(channels_last)::value;
    constexpr int kV = decltype(width)::value;
    const int64_t vectors = numel / kV;
    // NCHW: the vectors of one (n, c) row; channels_last: the channel vectors of a pixel, and of an image.
    const int64_t inner = kCl ? shape.C / kV : shape.HW / kV;
    const int64_t outer = kCl ? shape.HW * (shape.C / kV) : 1;
    const AffineIndex index{IndexDivider(inner, vectors), IndexDivider(outer, vectors), shape.C};
    channel_affine_kernel<T, kV, kCl, kShift>
        <<<grid_stride_blocks(vectors), kThreads, 0, stream>>>(out, a, s, d, vectors, index);
  };
  using Cl = std::true_type;
  using Nchw = std::false_type;
  using Vw = std::integral_constant<int, VW>;
  using One = std::integral_constant<int, 1>;
  if (shape.channels_last) {
    vec ? launch(Cl{}, Vw{}) : launch(Cl{}, One{});
  } else {
    vec ? launch(Nchw{}, Vw{}) : launch(Nchw{}, One{});
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor squeeze_excite_pool(const at::Tensor& x_in) {
  check_se_activation("squeeze_excite_pool", "x", x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const bool cl = use_channels_last(x_in);
  const at::Tensor x = se_layout(x_in, cl);
  const SqueezeExciteShape shape = se_shape(x, cl);
  at::Tensor out = at::empty({shape.N, shape.C}, x.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_squeeze_excite_pool_cuda", [&] {
    launch_channel_sums<scalar_t, false>(out.data_ptr<float>(), x.const_data_ptr<scalar_t>(), nullptr, shape,
                                         static_cast<float>(shape.HW), out.options(), at::cuda::getCurrentCUDAStream());
  });
  return out;
}

at::Tensor squeeze_excite_scale(const at::Tensor& x_in, const at::Tensor& scale_in) {
  const char* op = "squeeze_excite_scale";
  check_se_activation(op, "x", x_in);
  check_se_per_channel(op, "scale", scale_in, "x", x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const bool cl = use_channels_last(x_in);
  const at::Tensor x = se_layout(x_in, cl);
  const at::Tensor scale = scale_in.contiguous();
  at::Tensor y = at::empty_like(x);
  if (y.numel() == 0) return y;
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_squeeze_excite_scale_cuda", [&] {
    launch_channel_affine<scalar_t, false>(y.data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                                           scale.const_data_ptr<float>(), nullptr, se_shape(x, cl),
                                           at::cuda::getCurrentCUDAStream());
  });
  return y;
}

at::Tensor squeeze_excite_backward_reduce(const at::Tensor& grad_in, const at::Tensor& x_in) {
  const char* op = "squeeze_excite_backward_reduce";
  check_se_activation(op, "x", x_in);
  check_same_device(op, "grad_out", grad_in, "x", x_in);
  check_same_dtype(op, "grad_out", grad_in, "x", x_in);
  check_same_shape(op, "grad_out", grad_in, "x", x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const bool cl = use_channels_last(x_in);
  const at::Tensor x = se_layout(x_in, cl);
  const at::Tensor grad = se_layout(grad_in, cl);
  const SqueezeExciteShape shape = se_shape(x, cl);
  at::Tensor out = at::empty({shape.N, shape.C}, x.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_squeeze_excite_backward_reduce_cuda", [&] {
    launch_channel_sums<scalar_t, true>(out.data_ptr<float>(), grad.const_data_ptr<scalar_t>(),
                                        x.const_data_ptr<scalar_t>(), shape, 1.0f, out.options(),
                                        at::cuda::getCurrentCUDAStream());
  });
  return out;
}

at::Tensor squeeze_excite_backward_input(const at::Tensor& grad_in, const at::Tensor& scale_in,
                                         const at::Tensor& grad_pool_in) {
  const char* op = "squeeze_excite_backward_input";
  check_se_activation(op, "grad_out", grad_in);
  check_se_per_channel(op, "scale", scale_in, "grad_out", grad_in);
  check_se_per_channel(op, "grad_pool", grad_pool_in, "grad_out", grad_in);
  const c10::cuda::CUDAGuard guard(grad_in.device());
  const bool cl = use_channels_last(grad_in);
  const at::Tensor grad = se_layout(grad_in, cl);
  const SqueezeExciteShape shape = se_shape(grad, cl);
  at::Tensor dx = at::empty_like(grad);
  if (dx.numel() == 0) return dx;
  const at::Tensor scale = scale_in.contiguous();
  // dp / HW once per (n, c), a true division as eager's mean backward.
  const at::Tensor shift = grad_pool_in.div(static_cast<double>(shape.HW)).contiguous();
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(grad.scalar_type(), "fastops_squeeze_excite_backward_input_cuda", [&] {
    launch_channel_affine<scalar_t, true>(dx.data_ptr<scalar_t>(), grad.const_data_ptr<scalar_t>(),
                                          scale.const_data_ptr<float>(), shift.const_data_ptr<float>(), shape,
                                          at::cuda::getCurrentCUDAStream());
  });
  return dx;
}

}  // namespace
}  // namespace fastops::cuda

TORCH_LIBRARY_IMPL(fastops, CUDA, m) {
  m.impl("squeeze_excite_pool", &fastops::cuda::squeeze_excite_pool);
  m.impl("squeeze_excite_scale", &fastops::cuda::squeeze_excite_scale);
  m.impl("squeeze_excite_backward_reduce", &fastops::cuda::squeeze_excite_backward_reduce);
  m.impl("squeeze_excite_backward_input", &fastops::cuda::squeeze_excite_backward_input);
}
