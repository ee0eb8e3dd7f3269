// gelu and bias_gelu on CUDA.
//   erf form:  gelu = x * Phi(x) with Phi = x >= 0 ? 1 - T : T, T = 0.5 erfc(|x|/sqrt2) = exp(-x^2/2) Q(|x|)
//              (fastops/gelu_math.h: no 1 + erf cancellation in the negative tail);
//              gelu' = Phi + x * exp(-x^2/2) / sqrt(2 pi).
//   tanh form: gelu = x * s, s = sigmoid(2y) from e = exp(-2|y|); gelu' = s + x * s (1-s) * 2y'.
//   bias_gelu: the same on h = x + b[col], h never written; backward adds grad_bias = sum over rows.
//   fp16/bf16 outputs: a cheaper evaluation to ~1e-5 relative, enough for an 8- or 11-bit result
//   (erf_forward_reduced, tanh_forward_reduced, erf_backward_reduced); fp32 outputs and the tanh
//   form's backward: the full one.
//   The form is a template argument of the functors (one form's code per kernel).
// Strategy.
//   gelu fwd/bwd: the grid-stride elementwise loop of cuda_loops.cuh (16-byte vectors, 4 in flight).
//   bias_gelu: a 2-D launch over (column vectors, rows). Each thread owns one 16-byte column vector
//   (so its bias is loaded once into registers and no index is ever divided by the row length) and
//   walks rows with a stride, kRowUnroll rows of loads in flight. Vector width 16 bytes when the row
//   length is a multiple of it and every pointer is 16-byte aligned, else one element.
//   grad_bias: each thread sums its rows' unrounded fp32 gradients in registers, the block adds its
//   threadIdx.y rows in a fixed order through shared memory into partial[blockIdx.y][col] (no
//   atomics), and a second small kernel adds the gridDim.y partials per column in order. The grid
//   is a function of the shape only, so grad_bias is bitwise reproducible on a given GPU model.
// Bytes per element: gelu fwd 2*sizeof(T), bwd 3*sizeof(T); bias_gelu the same (bias and the fp32
// partials are O(columns)). At 3 TB/s a 4096 x 4096 bf16 bias_gelu forward moves 67 MB: ~22 us.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <fastops/checks.h>
#include <fastops/gelu_math.h>
#include <torch/library.h>
#include <fastops/cuda_loops.cuh>

#include <algorithm>
#include <limits>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace fastops::cuda {
namespace {

namespace gm = fastops::gelu_math;

// ---- math (M = opmath = float: the kernels take fp32, fp16 and bf16) ------------------------------

__device__ __forceinline__ float erf_forward(float x) {
  const float u = fminf(fabsf(x), gm::kTailClamp);  // NaN -> kTailClamp; x itself carries the NaN out
  const float q = gm::tail_q(u);
  const float ex = gm::gauss(u);
  // x < 0: (x * q) * ex keeps the intermediate normal where x * (q * ex) would go subnormal.
  return x >= 0.0f ? x * fmaf(-q, ex, 1.0f) : (x * q) * ex;
}

__device__ __forceinline__ float erf_backward(float g, float x) {
  const float u = fminf(fabsf(x), gm::kTailClamp);
  const float ex = gm::gauss(u);
  const float tail = gm::tail_q(u) * ex;
  const float cdf = x >= 0.0f ? 1.0f - tail : tail;
  return g * fmaf(x, ex * static_cast<float>(gm::kInvSqrt2Pi), cdf);
}

template <typename M>
__device__ __forceinline__ M tanh_y(M x) {
  return x * (static_cast<M>(gm::kTanhK) + static_cast<M>(gm::kTanhK * gm::kTanhC) * x * x);
}

template <typename M>
__device__ __forceinline__ M tanh_forward(M x) {
  const M y = tanh_y(x);
  const M e = exp(M(-2) * fabs(y));
  const M xr = x / (M(1) + e);
  return y >= M(0) ? xr : xr * e;  // (x r) e stays normal where e r alone would be subnormal
}

template <typename M>
__device__ __forceinline__ M tanh_backward(M g, M x) {
  const M x2 = x * x;
  const M y = tanh_y(x);
  const M e = exp(M(-2) * fabs(y));
  const M r = M(1) / (M(1) + e);
  const M s = y >= M(0) ? r : e * r;
  const M dy2 = static_cast<M>(2 * gm::kTanhK) + static_cast<M>(6 * gm::kTanhK * gm::kTanhC) * x2;
  return g * (s + x * ((e * r * r) * dy2));  // s (1 - s) = e / (1 + e)^2
}

// The full path, out of line where the bulk path falls back to it: it runs for few elements, and 32
// inlined copies (8 elements a vector, 4 vectors in flight) would crowd the hot loop.
__device__ __noinline__ float erf_forward_general(float x) { return erf_forward(x); }

// MUFU.RCP and MUFU.EX2 alone, for arguments that keep input and result normal: __fdividef and
// __expf add range guards (a denominator beyond 2^126, an argument below -126) that the erf bulk never
// needs (den >= 7.26, the argument >= -35.4).
__device__ __forceinline__ float rcp_approx(float v) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

__device__ __forceinline__ float exp2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

// The same with subnormal results kept (the tanh form's e reaches them for |y| > 43.6).
__device__ __forceinline__ float exp2_approx_subnormal(float v) {
  float r;
  asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

// fp16/bf16 outputs of the forward: a result rounded to 8 or 11 bits needs ~1e-5 relative, not fp32's
// few ulp, so the bulk |x| <= kBulkLimit takes gelu_math.h's degree-(2, 3) rational Q (9.5e-6) with
// the approximate reciprocal (1 ulp) and exp2 (2^-22 relative; its argument, up to 35.4 in size, is
// rounded once: ~3e-6), against the full path's IEEE division, degree-9 Horner chain and accurate expf
// with the split u^2: ~17 instructions an element instead of ~45. gelu = max(x, 0) - (u q) exp(-u^2/2)
// for both signs, the max as a select so that -0.0 stays -0.0. Beyond the bulk (the tail, inf, NaN:
// NaN fails the test) the full path runs; T(7) = 1.3e-12, so every result of the bulk is normal.
// The design (fit, approximations, roundings) is checked on the CPU over every fp16 and bf16 input
// and a dense fp32 grid (bias_gelu rounds x + bias only at the end): tests/ops/test_gelu.py,
// test_reduced_half_forward_design_on_the_host.
__device__ __forceinline__ float erf_forward_reduced(float x) {
  const float u = fabsf(x);
  if (u <= gm::kBulkLimit) {
    constexpr float n0 = gm::kBulkNReduced[0], n1 = gm::kBulkNReduced[1], n2 = gm::kBulkNReduced[2];
    constexpr float d0 = gm::kBulkDReduced[0], d1 = gm::kBulkDReduced[1], d2 = gm::kBulkDReduced[2];
    constexpr float kHalfLog2e = static_cast<float>(-0.5 * 1.4426950408889634);  // exp(-v/2) = 2^(v * this)
    const float num = fmaf(fmaf(n2, u, n1), u, n0);
    const float den = fmaf(fmaf(u + d2, u, d1), u, d0);
    const float uq = u * (num * rcp_approx(den));
    return fmaf(-uq, exp2_approx((u * u) * kHalfLog2e), x >= 0.0f ? x : 0.0f);
  }
  return erf_forward_general(x);
}

// The tanh form for fp16/bf16 outputs: s = 1 / (1 + e), e = exp(-2|y|), through MUFU.EX2 and MUFU.RCP
// (a few fp32 ulp, and the rounding of the exp2 argument 2|y| log2(e): 3.6e-6 relative at |y| = 43,
// the same order as what rounding y itself costs the fp32 path). Subnormal e are kept: bf16 holds the
// results they give (x e down to ~1e-38).
__device__ __forceinline__ float tanh_forward_reduced(float x) {
  constexpr float kTwoLog2e = static_cast<float>(-2.0 * 1.4426950408889634);
  const float y = tanh_y(x);
  const float e = exp2_approx_subnormal(fabsf(y) * kTwoLog2e);
  const float xr = x * rcp_approx(1.0f + e);
  return y >= 0.0f ? xr : xr * e;
}

__device__ __noinline__ float erf_backward_general(float g, float x) { return erf_backward(g, x); }

// The erf form's gradient for fp16/bf16 outputs: gelu' = x >= 0 ? 1 - E k : E k, E = exp(-u^2/2),
// k = (u0 - u) r(u) (gelu_math.h, kGradRoot / kGradRatio*: the root where Phi + x phi cancels is a
// factor, exact near it, so the result keeps its relative accuracy there too), r's rational with the
// approximate reciprocal and E with MUFU.EX2: ~20 instructions an element instead of ~50, where the
// bf16 backward was bound by its instructions (H200: 0.67-0.74x eager). 3.6e-6 relative worst case on
// a dense fp32 grid, the root included; every fp16/bf16 input within one step of the correctly rounded
// gradient (test_reduced_half_backward_design_on_the_host). Beyond the bulk (and NaN) the full path.
__device__ __forceinline__ float erf_backward_reduced(float g, float x) {
  const float u = fabsf(x);
  if (u <= gm::kBulkLimit) {
    constexpr float n0 = gm::kGradRatioN[0], n1 = gm::kGradRatioN[1], n2 = gm::kGradRatioN[2];
    constexpr float n3 = gm::kGradRatioN[3];
    constexpr float d0 = gm::kGradRatioD[0], d1 = gm::kGradRatioD[1], d2 = gm::kGradRatioD[2];
    constexpr float root_hi = gm::kGradRoot[0], root_lo = gm::kGradRoot[1];
    constexpr float kHalfLog2e = static_cast<float>(-0.5 * 1.4426950408889634);  // exp(-v/2) = 2^(v * this)
    const float num = fmaf(fmaf(fmaf(n3, u, n2), u, n1), u, n0);
    const float den = fmaf(fmaf(u + d2, u, d1), u, d0);
    const float k = ((root_hi - u) + root_lo) * (num * rcp_approx(den));
    const float ek = exp2_approx((u * u) * kHalfLog2e) * k;
    return g * (x >= 0.0f ? 1.0f - ek : ek);
  }
  return erf_backward_general(g, x);
}

// The form is a template argument: one form's code and registers per kernel, no per-element branch.
// kReduced: fp16/bf16 outputs (see erf_forward_reduced, erf_backward_reduced).
template <bool kTanh, bool kReduced>
struct GeluForward {
  __device__ float operator()(float x) const {
    if constexpr (kTanh) {
      return kReduced ? tanh_forward_reduced(x) : tanh_forward(x);
    } else {
      return kReduced ? erf_forward_reduced(x) : erf_forward(x);
    }
  }
};

template <bool kTanh, bool kReduced>
struct GeluBackward {
  __device__ float operator()(float g, float x) const {
    if constexpr (kTanh) {
      return tanh_backward(g, x);
    } else {
      return kReduced ? erf_backward_reduced(g, x) : erf_backward(g, x);
    }
  }
};

// f(std::bool_constant<tanh>) for the form `approximate` named.
template <typename F>
void with_form(bool use_tanh, const F& f) {
  if (use_tanh) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// The functors for outputs of type T.
template <typename T, typename Tanh>
using ForwardFor = GeluForward<Tanh::value, !std::is_same_v<T, float>>;
template <typename T, typename Tanh>
using BackwardFor = GeluBackward<Tanh::value, !std::is_same_v<T, float>>;

// ---- bias_gelu kernels ---------------------------------------------------------------------------

constexpr int kRowUnroll = 4;
constexpr int64_t kMaxRowBlocksForward = 65535;  // gridDim.y limit
constexpr int64_t kMaxRowBlocksBackward = 256;   // bounds the fp32 partials and the combine pass
constexpr int64_t kRowsPerThread = 16;

struct BiasGrid {
  dim3 grid, block;
};

// blockDim.x covers the column vectors (32..256 threads), blockDim.y the rest of 256 over rows;
// gridDim.y gives each thread ~kRowsPerThread rows. Depends on the shape only (see the file comment).
inline BiasGrid bias_grid(int64_t rows, int64_t col_vecs, int64_t max_row_blocks) {
  int bx = 32;
  while (bx < col_vecs && bx < kThreads) bx *= 2;
  const int by = kThreads / bx;
  const int64_t gx = (col_vecs + bx - 1) / bx;
  const int64_t gy = std::clamp<int64_t>((rows + by * kRowsPerThread - 1) / (by * kRowsPerThread), 1, max_row_blocks);
  TORCH_CHECK(gx <= std::numeric_limits<int32_t>::max(), "fastops.bias_gelu: x.shape[-1] is too large");
  return {dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(bx, by)};
}

template <typename T, int N, typename Op>
__global__ void __launch_bounds__(kThreads)
    bias_gelu_forward_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ bias, int64_t rows,
                             int64_t col_vecs, Op op) {
  using M = at::opmath_type<T>;
  using V = Vector<T, N>;
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cv >= col_vecs) return;
  const V bv = reinterpret_cast<const V*>(bias)[cv];
  M b[N];
#pragma unroll
  for (int j = 0; j < N; ++j) b[j] = static_cast<M>(bv.val[j]);
  const int64_t row_stride = static_cast<int64_t>(gridDim.y) * blockDim.y;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r0 < rows;
       r0 += row_stride * kRowUnroll) {
    V loaded[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t r = r0 + u * row_stride;
      if (r < rows) loaded[u] = reinterpret_cast<const V*>(x)[r * col_vecs + cv];
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int64_t r = r0 + u * row_stride;
      if (r < rows) {
        V result;
#pragma unroll
        for (int j = 0; j < N; ++j) result.val[j] = static_cast<T>(op(static_cast<M>(loaded[u].val[j]) + b[j]));
        reinterpret_cast<V*>(out)[r * col_vecs + cv] = result;
      }
    }
  }
}

template <typename T, int N, typename Op>
__global__ void __launch_bounds__(kThreads)
    bias_gelu_backward_kernel(T* __restrict__ dx, float* __restrict__ partial, const T* __restrict__ grad,
                              const T* __restrict__ x, const T* __restrict__ bias, int64_t rows, int64_t col_vecs,
                              Op op) {
  using M = at::opmath_type<T>;
  using V = Vector<T, N>;
  __shared__ float block_sums[kThreads * N];
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = cv < col_vecs;
  float acc[N];
#pragma unroll
  for (int j = 0; j < N; ++j) acc[j] = 0.0f;
  if (active) {
    const V bv = reinterpret_cast<const V*>(bias)[cv];
    M b[N];
#pragma unroll
    for (int j = 0; j < N; ++j) b[j] = static_cast<M>(bv.val[j]);
    const int64_t row_stride = static_cast<int64_t>(gridDim.y) * blockDim.y;
    for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r0 < rows;
         r0 += row_stride * kRowUnroll) {
      V xs[kRowUnroll], gs[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t r = r0 + u * row_stride;
        if (r < rows) {
          xs[u] = reinterpret_cast<const V*>(x)[r * col_vecs + cv];
          gs[u] = reinterpret_cast<const V*>(grad)[r * col_vecs + cv];
        }
      }
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t r = r0 + u * row_stride;
        if (r < rows) {
          V result;
#pragma unroll
          for (int j = 0; j < N; ++j) {
            const M d = op(static_cast<M>(gs[u].val[j]), static_cast<M>(xs[u].val[j]) + b[j]);
            acc[j] += static_cast<float>(d);  // the unrounded gradient, in row order
            result.val[j] = static_cast<T>(d);
          }
          reinterpret_cast<V*>(dx)[r * col_vecs + cv] = result;
        }
      }
    }
  }
  const int slot = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int j = 0; j < N; ++j) block_sums[slot * N + j] = acc[j];
  __syncthreads();
  if (threadIdx.y == 0 && active) {
    float sum[N];
#pragma unroll
    for (int j = 0; j < N; ++j) sum[j] = block_sums[threadIdx.x * N + j];
    for (int yy = 1; yy < static_cast<int>(blockDim.y); ++yy) {
#pragma unroll
      for (int j = 0; j < N; ++j) sum[j] += block_sums[(yy * blockDim.x + threadIdx.x) * N + j];
    }
    float* dst = partial + static_cast<int64_t>(blockIdx.y) * col_vecs * N + cv * N;
#pragma unroll
    for (int j = 0; j < N; ++j) dst[j] = sum[j];
  }
}

// ---- ops -------------------------------------------------------------------------------------------

at::Tensor gelu(const at::Tensor& x_in, std::string_view approximate) {
  const bool use_tanh = gm::parse_tanh("gelu", approximate);
  check_floating("gelu", "x", x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = densify(x_in);
  at::Tensor y = at::empty_like(x);
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_gelu_cuda", [&] {
    with_form(use_tanh, [&](auto form) {
      launch_elementwise<scalar_t, 1>(y.data_ptr<scalar_t>(), x.numel(), ForwardFor<scalar_t, decltype(form)>{},
                                      {x.const_data_ptr<scalar_t>()});
    });
  });
  return y;
}

at::Tensor gelu_backward(const at::Tensor& grad_in, const at::Tensor& x_in, std::string_view approximate) {
  const bool use_tanh = gm::parse_tanh("gelu_backward", approximate);
  check_floating("gelu_backward", "x", x_in);
  check_same_device("gelu_backward", "grad_out", grad_in, "x", x_in);
  check_same_dtype("gelu_backward", "grad_out", grad_in, "x", x_in);
  check_same_shape("gelu_backward", "grad_out", grad_in, "x", x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = densify(x_in);
  const at::Tensor grad = match_layout(grad_in, x);
  at::Tensor dx = at::empty_like(x);
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_gelu_backward_cuda", [&] {
    with_form(use_tanh, [&](auto form) {
      launch_elementwise<scalar_t, 2>(dx.data_ptr<scalar_t>(), x.numel(), BackwardFor<scalar_t, decltype(form)>{},
                                      {grad.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>()});
    });
  });
  return dx;
}

at::Tensor bias_gelu(const at::Tensor& x_in, const at::Tensor& bias_in, std::string_view approximate) {
  const bool use_tanh = gm::parse_tanh("bias_gelu", approximate);
  gm::check_bias_args("bias_gelu", x_in, bias_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const at::Tensor bias = bias_in.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  const int64_t n_cols = x.size(-1);
  if (x.numel() == 0) return y;
  const int64_t rows = x.numel() / n_cols;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_bias_gelu_cuda", [&] {
    with_form(use_tanh, [&](auto form) {
      const ForwardFor<scalar_t, decltype(form)> op;
      scalar_t* out = y.data_ptr<scalar_t>();
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* bp = bias.const_data_ptr<scalar_t>();
      constexpr int kVec = kVectorWidth<scalar_t>;
      if (vectorizable<scalar_t>(n_cols, {out, xp, bp})) {
        const BiasGrid g = bias_grid(rows, n_cols / kVec, kMaxRowBlocksForward);
        bias_gelu_forward_kernel<scalar_t, kVec><<<g.grid, g.block, 0, stream>>>(out, xp, bp, rows, n_cols / kVec, op);
      } else {
        const BiasGrid g = bias_grid(rows, n_cols, kMaxRowBlocksForward);
        bias_gelu_forward_kernel<scalar_t, 1><<<g.grid, g.block, 0, stream>>>(out, xp, bp, rows, n_cols, op);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad_in, const at::Tensor& x_in,
                                                      const at::Tensor& bias_in, std::string_view approximate) {
  const bool use_tanh = gm::parse_tanh("bias_gelu_backward", approximate);
  gm::check_bias_args("bias_gelu_backward", x_in, bias_in);
  check_same_device("bias_gelu_backward", "grad_out", grad_in, "x", x_in);
  check_same_dtype("bias_gelu_backward", "grad_out", grad_in, "x", x_in);
  check_same_shape("bias_gelu_backward", "grad_out", grad_in, "x", x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  const at::Tensor grad = grad_in.contiguous();
  const at::Tensor bias = bias_in.contiguous();
  at::Tensor dx = at::empty(x.sizes(), x.options());
  const int64_t n_cols = x.size(-1);
  if (x.numel() == 0) return {dx, at::zeros_like(bias_in)};
  const int64_t rows = x.numel() / n_cols;
  at::Tensor grad_bias = at::empty({n_cols}, bias.options());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_bias_gelu_backward_cuda", [&] {
    with_form(use_tanh, [&](auto form) {
      const BackwardFor<scalar_t, decltype(form)> op;
      scalar_t* dxp = dx.data_ptr<scalar_t>();
      const scalar_t* gp = grad.const_data_ptr<scalar_t>();
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      const scalar_t* bp = bias.const_data_ptr<scalar_t>();
      constexpr int kVec = kVectorWidth<scalar_t>;
      const bool vec = vectorizable<scalar_t>(n_cols, {dxp, gp, xp, bp});
      const BiasGrid g = bias_grid(rows, vec ? n_cols / kVec : n_cols, kMaxRowBlocksBackward);
      at::Tensor partial = at::empty({static_cast<int64_t>(g.grid.y), n_cols}, x.options().dtype(at::kFloat));
      float* pp = partial.data_ptr<float>();
      if (vec) {
        bias_gelu_backward_kernel<scalar_t, kVec>
            <<<g.grid, g.block, 0, stream>>>(dxp, pp, gp, xp, bp, rows, n_cols / kVec, op);
      } else {
        bias_gelu_backward_kernel<scalar_t, 1><<<g.grid, g.block, 0, stream>>>(dxp, pp, gp, xp, bp, rows, n_cols, op);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      launch_sum_rows_in_order(pp, static_cast<int64_t>(g.grid.y), n_cols,
                               StoreAs<scalar_t>{grad_bias.data_ptr<scalar_t>()}, stream);
    });
  });
  return {dx, grad_bias};
}

}  // namespace
}  // namespace fastops::cuda

TORCH_LIBRARY_IMPL(fastops, CUDA, m) {
  m.impl("gelu", &fastops::cuda::gelu);
  m.impl("gelu_backward", &fastops::cuda::gelu_backward);
  m.impl("bias_gelu", &fastops::cuda::bias_gelu);
  m.impl("bias_gelu_backward", &fastops::cuda::bias_gelu_backward);
}
