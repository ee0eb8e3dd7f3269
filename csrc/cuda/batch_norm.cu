// batch_norm on CUDA (checks and layout rule: fastops/batch_norm.h). Per channel c, over count = N * L:
//   forward: training: mean, var = sum (x - mean)^2 / count, unbiased_var = the same / (count - 1) (for the
//     caller's running-statistics update); eval: the running mean and var. invstd = 1 / sqrt(var + eps),
//     y = (x - mean) * (invstd * w) + b.
//   backward: sum_dy = sum g, sum_dy_xmu = sum g * (x - mean); grad_weight = sum_dy_xmu * invstd, grad_bias =
//     sum_dy; dx = (g - sum_dy / count - (x - mean) * invstd^2 * sum_dy_xmu / count) * invstd * w (training),
//     g * invstd * w (eval).
// Layouts: planes (N * C runs of L contiguous elements), rows (N * L rows of C channels: channels_last or L == 1).
// Strategy, fp32 math and accumulation; three kernels per op:
//   1. Partials: a channel's elements are cut into `splits` ranges (~8 blocks per SM in all); each block
//      writes one fp32 partial per (split, channel): (count, mean, M2) forward, (sum_dy, sum_dy_xmu)
//      backward. Welford by batches: a thread loads kBatch 16-byte vectors, takes the batch's own mean and
//      M2 in registers and folds them in with Chan's formula (one division a batch, no E[x^2] - E[x]^2).
//      Planes: grid (C, splits) of 256 threads over the channel's vectors (an IndexDivider finds the run).
//      Rows: grid (channel blocks, splits), block (lanes, 256 / lanes): threadIdx.x over vectors of channels
//      (coalesced along a row; lanes < 32 when C is small), threadIdx.y over rows. Then a shared-memory tree.
//   2. Finalize: a thread per channel folds its partials in split order (no atomics: bitwise reproducible
//      for a shape on a given GPU) into the per-channel outputs and a float4 of coefficients for pass 3.
//   3. Pass: grid-stride over 16-byte vectors (when L or C, the row of the layout, is a multiple of the
//      width and the pointers are aligned; else single elements), coefficients per vector (planes) or per
//      element (rows), writing y or dx.
// Bytes per element of x: forward 3 sizeof(T) training (x read twice, y written), 2 eval; backward 5
// sizeof(T) training (g and x twice, dx once), 4 eval, 2 without input_grad. At 4.8 TB/s a 64M-element bf16
// training forward should take ~0.08 ms.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fastops/batch_norm.h>
#include <fastops/checks.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <type_traits>

#include <fastops/fast_divmod.h>
#include <fastops/cuda_common.cuh>

namespace fastops::cuda {
namespace {

constexpr int kBatch = 4;  // vectors (planes) or rows (rows layout) a thread loads before folding them
constexpr int kWarp = 32;

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

// Forward partial: count, mean and M2 = sum (x - mean)^2 of a set of elements (no default member
// initializers: it lives in __shared__).
struct Welford {
  float n, mean, m2;
  static constexpr bool kTwoInputs = false;
  __device__ static Welford zero() { return {0.f, 0.f, 0.f}; }

  // Folds in the first m (> 0) of the K values of a; b and the channel mean are the backward's.
  template <int K>
  __device__ void add(const float (&a)[K], const float (&)[K], int m, float) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < K; ++i) sum += i < m ? a[i] : 0.f;
    const float batch_mean = m == K ? sum * (1.f / K) : __fdividef(sum, static_cast<float>(m));
    float batch_m2 = 0.f;
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const float d = a[i] - batch_mean;
      batch_m2 += i < m ? d * d : 0.f;
    }
    fold(static_cast<float>(m), batch_mean, batch_m2, __fdividef(static_cast<float>(m), n + m));
  }

  // Chan et al.: this set and another of count bn, mean bm and M2 bm2; r = bn / (n + bn).
  __device__ void fold(float bn, float bm, float bm2, float r) {
    const float delta = bm - mean;
    mean += delta * r;
    m2 += bm2 + delta * delta * n * r;
    n += bn;
  }

  __device__ void combine(const Welford& o) {
    if (o.n == 0.f) return;
    fold(o.n, o.mean, o.m2, o.n / (n + o.n));
  }
};

// Backward partial: sum g and sum g * (x - mean) of a set of elements.
struct GradSums {
  float dy, dy_xmu;
  static constexpr bool kTwoInputs = true;
  __device__ static GradSums zero() { return {0.f, 0.f}; }

  template <int K>
  __device__ void add(const float (&g)[K], const float (&x)[K], int m, float mean) {
#pragma unroll
    for (int i = 0; i < K; ++i) {
      if (i < m) {
        dy += g[i];
        dy_xmu = fmaf(g[i], x[i] - mean, dy_xmu);
      }
    }
  }

  __device__ void combine(const GradSums& o) {
    dy += o.dy;
    dy_xmu += o.dy_xmu;
  }
};

// Planes: partial[split, c] over vectors [split * per_split, ...) of channel c's N * (L / V) vectors;
// grid (C, splits). `run` divides by L / V, the vectors of one (n, c) run.
template <typename Acc, typename T, int V>
__global__ void __launch_bounds__(kThreads)
    planes_partials_kernel(Acc* __restrict__ partial, const T* __restrict__ a, const T* __restrict__ b,
                           const float* __restrict__ mean, int64_t C, int64_t vectors, int64_t per_split,
                           IndexDivider run) {
  using Vec = Vector<T, V>;
  __shared__ Acc tree[kThreads];
  const int64_t c = blockIdx.x;
  const int64_t begin = blockIdx.y * per_split;
  const int64_t end = begin + per_split < vectors ? begin + per_split : vectors;
  const float mean_c = Acc::kTwoInputs ? mean[c] : 0.f;
  Acc acc = Acc::zero();
  for (int64_t base = begin + threadIdx.x; base < end; base += kThreads * kBatch) {
    float va[kBatch * V] = {}, vb[kBatch * V] = {};
    int m = 0;  // j grows with u: the valid vectors are a prefix
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t j = base + u * kThreads;
      if (j < end) {
        const int64_t n = run.div(j);
        const int64_t off = ((n * C + c) * run.divisor + (j - n * run.divisor)) * V;
        const Vec xa = *reinterpret_cast<const Vec*>(a + off);
#pragma unroll
        for (int k = 0; k < V; ++k) va[u * V + k] = static_cast<float>(xa.val[k]);
        if constexpr (Acc::kTwoInputs) {
          const Vec xb = *reinterpret_cast<const Vec*>(b + off);
#pragma unroll
          for (int k = 0; k < V; ++k) vb[u * V + k] = static_cast<float>(xb.val[k]);
        }
        m += V;
      }
    }
    acc.add(va, vb, m, mean_c);
  }
  tree[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) tree[threadIdx.x].combine(tree[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.y * C + c] = tree[0];
}

// Rows: partial[split, c0 .. c0 + V) over rows [split * per_split, ...) of the R rows of C channels;
// grid (channel blocks, splits), block (lanes, kThreads / lanes).
template <typename Acc, typename T, int V>
__global__ void __launch_bounds__(kThreads)
    rows_partials_kernel(Acc* __restrict__ partial, const T* __restrict__ a, const T* __restrict__ b,
                         const float* __restrict__ mean, int64_t C, int64_t R, int64_t per_split) {
  using Vec = Vector<T, V>;
  __shared__ Acc tree[kThreads * V];
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  const int64_t begin = blockIdx.y * per_split;
  const int64_t end = begin + per_split < R ? begin + per_split : R;
  Acc acc[V];
  float mean_c[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    acc[k] = Acc::zero();
    mean_c[k] = Acc::kTwoInputs && c0 < C ? mean[c0 + k] : 0.f;
  }
  if (c0 < C) {
    for (int64_t base = begin + threadIdx.y; base < end; base += static_cast<int64_t>(blockDim.y) * kBatch) {
      float va[V][kBatch] = {}, vb[V][kBatch] = {};
      int m = 0;
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t r = base + static_cast<int64_t>(u) * blockDim.y;
        if (r < end) {
          const Vec xa = *reinterpret_cast<const Vec*>(a + r * C + c0);
#pragma unroll
          for (int k = 0; k < V; ++k) va[k][u] = static_cast<float>(xa.val[k]);
          if constexpr (Acc::kTwoInputs) {
            const Vec xb = *reinterpret_cast<const Vec*>(b + r * C + c0);
#pragma unroll
            for (int k = 0; k < V; ++k) vb[k][u] = static_cast<float>(xb.val[k]);
          }
          ++m;
        }
      }
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k].add(va[k], vb[k], m, mean_c[k]);
    }
  }
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int k = 0; k < V; ++k) tree[tid * V + k] = acc[k];
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s /= 2) {
    if (threadIdx.y < s) {
#pragma unroll
      for (int k = 0; k < V; ++k) tree[tid * V + k].combine(tree[(tid + s * blockDim.x) * V + k]);
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && c0 < C) {
#pragma unroll
    for (int k = 0; k < V; ++k) partial[blockIdx.y * C + c0 + k] = tree[threadIdx.x * V + k];
  }
}

// The partials of every channel of a (and b) in the layout of `shape`: a (splits, C) array of Acc.
template <typename Acc, typename T>
at::Tensor channel_partials(const T* a, const T* b, const float* mean, const BatchNormShape& shape,
                            const at::TensorOptions& float_options, cudaStream_t stream) {
  static_assert(sizeof(Acc) % sizeof(float) == 0 && std::is_trivially_copyable_v<Acc>);
  constexpr int VW = kVectorWidth<T>;
  const int64_t C = shape.C, want_blocks = 8 * static_cast<int64_t>(multiprocessor_count());
  // splits for `blocks` blocks a split over `items`, each split at least min_items; then no empty split.
  auto cut = [&](int64_t items, int64_t blocks, int64_t min_items, int64_t& per_split) {
    const int64_t most = std::min<int64_t>(65535, (items + min_items - 1) / min_items);
    const int64_t splits = std::clamp<int64_t>(want_blocks / blocks, 1, std::max<int64_t>(most, 1));
    per_split = (items + splits - 1) / splits;
    return (items + per_split - 1) / per_split;
  };
  auto workspace = [&](int64_t splits) {
    return at::empty({splits, C, static_cast<int64_t>(sizeof(Acc) / sizeof(float))}, float_options);
  };
  at::Tensor partial;
  if (!shape.rows) {
    auto launch = [&](auto width) {
      constexpr int kV = decltype(width)::value;
      const int64_t vectors = shape.N * (shape.L / kV);
      int64_t per_split = 0;
      const int64_t splits = cut(vectors, C, int64_t{kThreads} * kBatch, per_split);
      partial = workspace(splits);
      planes_partials_kernel<Acc, T, kV>
          <<<dim3(static_cast<unsigned>(C), static_cast<unsigned>(splits)), kThreads, 0, stream>>>(
              reinterpret_cast<Acc*>(partial.data_ptr<float>()), a, b, mean, C, vectors, per_split,
              IndexDivider(shape.L / kV, vectors));
    };
    vectorizable<T>(shape.L, {a, Acc::kTwoInputs ? b : a}) ? launch(std::integral_constant<int, VW>{})
                                                           : launch(std::integral_constant<int, 1>{});
  } else {
    auto launch = [&](auto width) {
      constexpr int kV = decltype(width)::value;
      const int64_t channel_vectors = C / kV;
      int lanes = 1;
      while (lanes < kWarp && lanes < channel_vectors) lanes *= 2;
      const int64_t channel_blocks = (channel_vectors + lanes - 1) / lanes;
      const int64_t R = shape.N * shape.L;
      int64_t per_split = 0;
      const int64_t splits = cut(R, channel_blocks, int64_t{kThreads / lanes} * kBatch, per_split);
      partial = workspace(splits);
      rows_partials_kernel<Acc, T, kV>
          <<<dim3(static_cast<unsigned>(channel_blocks), static_cast<unsigned>(splits)), dim3(lanes, kThreads / lanes),
             0, stream>>>(reinterpret_cast<Acc*>(partial.data_ptr<float>()), a, b, mean, C, R, per_split);
    };
    vectorizable<T>(C, {a, Acc::kTwoInputs ? b : a}) ? launch(std::integral_constant<int, VW>{})
                                                     : launch(std::integral_constant<int, 1>{});
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return partial;
}

// Forward, per channel: the statistics (folded from `splits` partials in training, else the running
// ones) and coef = (mean, invstd * w, b) for y = (x - mean) * coef.y + coef.z.
__global__ void finalize_forward_kernel(const Welford* __restrict__ partial, int64_t splits, int64_t C, bool training,
                                        float count, float eps, const float* __restrict__ running_mean,
                                        const float* __restrict__ running_var, const float* __restrict__ weight,
                                        const float* __restrict__ bias, float* __restrict__ mean_out,
                                        float* __restrict__ invstd_out, float* __restrict__ unbiased_out,
                                        float4* __restrict__ coef) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float mean, var;
    if (training) {
      Welford t = Welford::zero();
      for (int64_t s = 0; s < splits; ++s) t.combine(partial[s * C + c]);
      // No elements (empty x): NaN statistics, as torch.var_mean of an empty tensor.
      mean = count > 0.f ? t.mean : quiet_nan();
      var = count > 0.f ? t.m2 / count : quiet_nan();
      unbiased_out[c] = count > 1.f ? t.m2 / (count - 1.f) : quiet_nan();
    } else {
      mean = running_mean[c];
      var = running_var[c];
    }
    const float invstd = 1.f / sqrtf(var + eps);
    mean_out[c] = mean;
    invstd_out[c] = invstd;
    coef[c] = make_float4(mean, invstd * (weight ? weight[c] : 1.f), bias ? bias[c] : 0.f, 0.f);
  }
}

// Backward, per channel: grad_weight, grad_bias and coef = (mean, sum_dy / count, invstd^2 * sum_dy_xmu /
// count, invstd * w) for dx = (g - coef.y - (x - coef.x) * coef.z) * coef.w.
__global__ void finalize_backward_kernel(const GradSums* __restrict__ partial, int64_t splits, int64_t C, bool training,
                                         float count, const float* __restrict__ mean, const float* __restrict__ invstd,
                                         const float* __restrict__ weight, float* __restrict__ grad_weight,
                                         float* __restrict__ grad_bias, float4* __restrict__ coef) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < C;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    GradSums t = GradSums::zero();
    for (int64_t s = 0; s < splits; ++s) t.combine(partial[s * C + c]);
    const float is = invstd[c];
    grad_weight[c] = t.dy_xmu * is;
    grad_bias[c] = t.dy;
    const float grad_scale = is * (weight ? weight[c] : 1.f);
    coef[c] = training ? make_float4(mean[c], t.dy / count, is * is * t.dy_xmu / count, grad_scale)
                       : make_float4(0.f, 0.f, 0.f, grad_scale);
  }
}

// The ops of the pass: out = op(a, b, coefficients of the element's channel).
struct NormalizeOp {
  static constexpr bool kTwoInputs = false;
  __device__ float operator()(float x, float, float4 k) const { return fmaf(x - k.x, k.y, k.z); }
};
struct InputGradOp {
  static constexpr bool kTwoInputs = true;
  __device__ float operator()(float g, float x, float4 k) const { return (g - k.y - (x - k.x) * k.z) * k.w; }
};
struct InputGradEvalOp {
  static constexpr bool kTwoInputs = false;
  __device__ float operator()(float g, float, float4 k) const { return g * k.w; }
};

// out = op(a, b, coef[c]) over `vectors` vectors of V elements. Planes: c = (v / inner) % C (inner = L / V,
// outer = C); rows: c = (v % inner) * V + k (inner = C / V).
template <typename T, int V, bool kRows, typename Op>
__global__ void __launch_bounds__(kThreads)
    channel_pass_kernel(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b,
                        const float4* __restrict__ coef, int64_t vectors, IndexDivider inner, IndexDivider outer,
                        Op op) {
  using Vec = Vector<T, V>;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Vec va = reinterpret_cast<const Vec*>(a)[v];
    Vec vb;
    if constexpr (Op::kTwoInputs) vb = reinterpret_cast<const Vec*>(b)[v];
    Vec vo;
    if constexpr (kRows) {
      const int64_t c0 = inner.mod(v) * V;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xb = Op::kTwoInputs ? static_cast<float>(vb.val[k]) : 0.f;
        vo.val[k] = static_cast<T>(op(static_cast<float>(va.val[k]), xb, coef[c0 + k]));
      }
    } else {
      const float4 kc = coef[outer.mod(inner.div(v))];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xb = Op::kTwoInputs ? static_cast<float>(vb.val[k]) : 0.f;
        vo.val[k] = static_cast<T>(op(static_cast<float>(va.val[k]), xb, kc));
      }
    }
    reinterpret_cast<Vec*>(out)[v] = vo;
  }
}

template <typename T, typename Op>
void launch_channel_pass(T* out, const T* a, const T* b, const float4* coef, const BatchNormShape& shape, Op op,
                         cudaStream_t stream) {
  const int64_t numel = shape.N * shape.C * shape.L;
  const bool vec = vectorizable<T>(shape.rows ? shape.C : shape.L, {out, a, Op::kTwoInputs ? b : a});
  auto launch = [&](auto rows, auto width) {
    constexpr bool kRows = decltype(rows)::value;
    constexpr int kV = decltype(width)::value;
    const int64_t vectors = numel / kV;
    const IndexDivider inner(kRows ? shape.C / kV : shape.L / kV, vectors);
    const IndexDivider outer(kRows ? 1 : shape.C, vectors);
    channel_pass_kernel<T, kV, kRows, Op>
        <<<grid_stride_blocks(vectors), kThreads, 0, stream>>>(out, a, b, coef, vectors, inner, outer, op);
  };
  using Vw = std::integral_constant<int, kVectorWidth<T>>;
  using One = std::integral_constant<int, 1>;
  if (shape.rows) {
    vec ? launch(std::true_type{}, Vw{}) : launch(std::true_type{}, One{});
  } else {
    vec ? launch(std::false_type{}, Vw{}) : launch(std::false_type{}, One{});
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// A per-channel tensor as contiguous fp32 (it may come in x's dtype), or undefined.
at::Tensor as_float(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->to(at::kFloat).contiguous() : at::Tensor();
}

const float* ptr_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr<float>() : nullptr; }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm(const at::Tensor& x_in,
                                                                      const std::optional<at::Tensor>& weight_in,
                                                                      const std::optional<at::Tensor>& bias_in,
                                                                      const std::optional<at::Tensor>& running_mean_in,
                                                                      const std::optional<at::Tensor>& running_var_in,
                                                                      bool training, double eps) {
  check_bn_forward("batch_norm", x_in, weight_in, bias_in, running_mean_in, running_var_in, training, eps);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const bool rows = bn_rows(x_in);
  const at::Tensor x = bn_layout(x_in, rows);
  const BatchNormShape shape = bn_shape(x, rows);
  const auto float_options = x.options().dtype(at::kFloat);
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty({shape.C}, float_options);
  at::Tensor invstd = at::empty({shape.C}, float_options);
  at::Tensor unbiased_var = at::empty({training ? shape.C : 0}, float_options);
  if (shape.C == 0) return {y, mean, invstd, unbiased_var};
  const at::Tensor weight = as_float(weight_in), bias = as_float(bias_in);
  const at::Tensor running_mean = training ? at::Tensor() : as_float(running_mean_in);
  const at::Tensor running_var = training ? at::Tensor() : as_float(running_var_in);
  at::Tensor coef = at::empty({shape.C, 4}, float_options);
  auto* coef_ptr = reinterpret_cast<float4*>(coef.data_ptr<float>());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_batch_norm_cuda", [&] {
    at::Tensor partial;
    if (training && x.numel() > 0) {
      partial = channel_partials<Welford, scalar_t>(x.const_data_ptr<scalar_t>(), nullptr, nullptr, shape,
                                                    float_options, stream);
    }
    const int64_t splits = partial.defined() ? partial.size(0) : 0;
    finalize_forward_kernel<<<grid_stride_blocks(shape.C), kThreads, 0, stream>>>(
        partial.defined() ? reinterpret_cast<const Welford*>(partial.const_data_ptr<float>()) : nullptr, splits,
        shape.C, training, static_cast<float>(shape.count()), static_cast<float>(eps), ptr_or_null(running_mean),
        ptr_or_null(running_var), ptr_or_null(weight), ptr_or_null(bias), mean.data_ptr<float>(),
        invstd.data_ptr<float>(), training ? unbiased_var.data_ptr<float>() : nullptr, coef_ptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (x.numel() > 0) {
      launch_channel_pass<scalar_t>(y.data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), nullptr, coef_ptr, shape,
                                    NormalizeOp{}, stream);
    }
  });
  return {y, mean, invstd, unbiased_var};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_backward(const at::Tensor& grad_in, const at::Tensor& x_in,
                                                                   const std::optional<at::Tensor>& weight_in,
                                                                   const at::Tensor& mean_in,
                                                                   const at::Tensor& invstd_in, bool training,
                                                                   bool input_grad) {
  check_bn_backward("batch_norm_backward", grad_in, x_in, weight_in, mean_in, invstd_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const bool rows = bn_rows(x_in);
  const at::Tensor x = bn_layout(x_in, rows);
  const at::Tensor grad = match_layout(grad_in, x);
  const BatchNormShape shape = bn_shape(x, rows);
  const auto float_options = x.options().dtype(at::kFloat);
  at::Tensor dx = input_grad ? at::empty_like(x) : at::empty({0}, x.options());
  if (x.numel() == 0) {
    return {dx, at::zeros({shape.C}, float_options), at::zeros({shape.C}, float_options)};
  }
  at::Tensor grad_weight = at::empty({shape.C}, float_options);
  at::Tensor grad_bias = at::empty({shape.C}, float_options);
  const at::Tensor mean = mean_in.contiguous(), invstd = invstd_in.contiguous(), weight = as_float(weight_in);
  at::Tensor coef = at::empty({shape.C, 4}, float_options);
  auto* coef_ptr = reinterpret_cast<float4*>(coef.data_ptr<float>());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  FASTOPS_DISPATCH_FLOAT_HALF_BF16(x.scalar_type(), "fastops_batch_norm_backward_cuda", [&] {
    const scalar_t* g = grad.const_data_ptr<scalar_t>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const at::Tensor partial =
        channel_partials<GradSums, scalar_t>(g, xp, mean.const_data_ptr<float>(), shape, float_options, stream);
    finalize_backward_kernel<<<grid_stride_blocks(shape.C), kThreads, 0, stream>>>(
        reinterpret_cast<const GradSums*>(partial.const_data_ptr<float>()), partial.size(0), shape.C, training,
        static_cast<float>(shape.count()), mean.const_data_ptr<float>(), invstd.const_data_ptr<float>(),
        ptr_or_null(weight), grad_weight.data_ptr<float>(), grad_bias.data_ptr<float>(), coef_ptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (input_grad && training) {
      launch_channel_pass<scalar_t>(dx.data_ptr<scalar_t>(), g, xp, coef_ptr, shape, InputGradOp{}, stream);
    } else if (input_grad) {
      launch_channel_pass<scalar_t>(dx.data_ptr<scalar_t>(), g, nullptr, coef_ptr, shape, InputGradEvalOp{}, stream);
    }
  });
  return {dx, grad_weight, grad_bias};
}

}  // namespace
}  // namespace fastops::cuda

TORCH_LIBRARY_IMPL(fastops, CUDA, m) {
  m.impl("batch_norm", &fastops::cuda::batch_norm);
  m.impl("batch_norm_backward", &fastops::cuda::batch_norm_backward);
}
