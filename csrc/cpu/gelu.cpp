// gelu and bias_gelu on the CPU.
//   erf form ("none"):  gelu(x) = x * Phi(x),   Phi = normal CDF,  gelu'(x) = Phi(x) + x * phi(x)
//     evaluated through the upper tail T(|x|) = 0.5 erfc(|x|/sqrt2) = exp(-x^2/2) * Q(|x|)
//     (fastops/gelu_math.h): Phi = x >= 0 ? 1 - T : T, so the negative tail keeps its relative
//     accuracy, and exp(-x^2/2) is shared by Phi and phi = exp(-x^2/2) / sqrt(2 pi).
//   tanh form: gelu(x) = x * s,  s = 0.5 (1 + tanh(y)) = sigmoid(2y),  y = k (x + c x^3),
//     s from e = exp(-2|y|) in (0, 1]: s = y >= 0 ? 1/(1+e) : e/(1+e) (no overflow, no cancellation);
//     gelu'(x) = s + x * s (1-s) * 2y',  s (1-s) = e / (1+e)^2.
//   bias_gelu(x, b) = gelu(x + b[last dim]); its backward gives grad_x and grad_bias = sum over
//     every leading dim of grad_x.
// Layouts: gelu walks any dense tensor flat (densify); bias_gelu walks x contiguous as rows x N.
// Strategy: at::vec (fp16/bf16 widened to fp32 vectors), at::parallel_for over flat chunks. fp64
// uses Sleef's double erfc/exp (gradcheck). grad_bias is reduced deterministically: the rows are
// cut into a fixed number of row blocks that depends only on the shape (never on the thread count),
// each (row block, column block) tile sums its rows in order into an fp32 partial, and the partials
// are added in row-block order (cpu_reduce.h). The ISA-specific vector math is in cpu_vec_math.h.
// Bytes per element: gelu fwd 2*sizeof(T), bwd 3*sizeof(T); bias_gelu the same plus the bias once.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <fastops/checks.h>
#include <fastops/cpu_loops.h>
#include <fastops/cpu_reduce.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/gelu_math.h>
#include <torch/library.h>

#include <string_view>
#include <tuple>

namespace fastops::cpu {
namespace {

namespace gm = fastops::gelu_math;
using DVec = at::vec::Vectorized<double>;

// Q(u) = t * P(t), t = 1 / (1 + a u): gelu_math.h's degree-9 fit, or a degree-6 one (kReduced,
// 3.7e-6 relative). The erf form runs kFull for fp32 and fp64 outputs and for every backward (Phi +
// x phi cancels near x = -0.75, so the gradient needs Phi and phi to fp32 accuracy whatever the
// output dtype), kReduced for the fp16/bf16 forward (with gauss's reduced exp: ~1e-5 relative in
// all, 7 instructions cheaper per vector).
template <Accuracy kAcc>
inline FVec tail_q(const FVec& u) {
  if constexpr (kAcc == Accuracy::kFull) {
    const FVec t = FVec(1.0f) / at::vec::fmadd(FVec(gm::kTailA), u, FVec(1.0f));
    return t * gm::tail_poly(t, VecFma{});
  } else {
    const FVec t = FVec(1.0f) / at::vec::fmadd(FVec(0.28f), u, FVec(1.0f));
    FVec p = at::vec::fmadd(FVec(-5.023100227e-02f), t, FVec(1.054428369e-01f));
    p = at::vec::fmadd(p, t, FVec(2.495023236e-02f));
    p = at::vec::fmadd(p, t, FVec(9.445580095e-02f));
    p = at::vec::fmadd(p, t, FVec(1.019357890e-01f));
    p = at::vec::fmadd(p, t, FVec(1.117406636e-01f));
    p = at::vec::fmadd(p, t, FVec(1.117038429e-01f));
    return t * p;
  }
}

// fp32 math: ex = exp(-x^2/2) and q = Q(|x|), so T(|x|) = q * ex (see gelu_math.h). |x| is
// clamped to kTailClamp first (ex is 0 beyond it), so x*x and its exact low part stay finite and
// t stays > 0 (q is then finite and x = -inf gives -inf * q * 0 = nan, as PyTorch's gelu); NaN
// passes through the clamp. t = 1 / (1 + a u) is a true division: the divider runs beside the
// FMA ports, which are what this loop is bound by (an rcp14 + Newton step measured slower).
template <Accuracy kAcc>
inline void erf_tail_parts(const FVec& x, FVec& ex, FVec& q) {
  const FVec u = abs_min(x, FVec(gm::kTailClamp));
  q = tail_q<kAcc>(u);
  ex = gauss<kAcc>(u);
}

template <Accuracy kAcc>
struct GeluErfForward {
  FVec operator()(const FVec& x) const {
    FVec ex, q;
    erf_tail_parts<kAcc>(x, ex, q);
    // x < 0: (x * q) * ex keeps the intermediate normal where x * T alone would go subnormal.
    const FVec neg = (x * q) * ex;
    const FVec pos = x * fnmadd(q, ex, FVec(1.0f));
    return FVec::blendv(neg, pos, x >= FVec(0.0f));
  }
  DVec operator()(const DVec& x) const {
    const DVec tail = (x.abs() * DVec(gm::kSqrtHalf)).erfc() * DVec(0.5);
    return DVec::blendv(x * tail, x * (DVec(1.0) - tail), x >= DVec(0.0));
  }
};

template <Accuracy kAcc>
struct GeluErfBackward {
  FVec operator()(const FVec& g, const FVec& x) const {
    FVec ex, q;
    erf_tail_parts<kAcc>(x, ex, q);
    const FVec tail = q * ex;
    const FVec cdf = FVec::blendv(tail, FVec(1.0f) - tail, x >= FVec(0.0f));
    return g * at::vec::fmadd(x, ex * FVec(static_cast<float>(gm::kInvSqrt2Pi)), cdf);
  }
  DVec operator()(const DVec& g, const DVec& x) const {
    const DVec tail = (x.abs() * DVec(gm::kSqrtHalf)).erfc() * DVec(0.5);
    const DVec cdf = DVec::blendv(tail, DVec(1.0) - tail, x >= DVec(0.0));
    const DVec pdf = (x * x * DVec(-0.5)).exp() * DVec(gm::kInvSqrt2Pi);
    return g * (cdf + x * pdf);
  }
};

// tanh form: s = sigmoid(2y) and e*r = e / (1+e) with e = exp(-2|y|), r = 1 / (1+e).
template <typename V>
inline void tanh_parts(const V& x, const V& x2, V& s, V& er, V& r) {
  using M = typename V::value_type;
  const V y = x * at::vec::fmadd(V(static_cast<M>(gm::kTanhK * gm::kTanhC)), x2, V(static_cast<M>(gm::kTanhK)));
  const V e = (y.abs() * V(M(-2))).exp();
  r = V(M(1)) / (V(M(1)) + e);
  er = e * r;
  s = V::blendv(er, r, y >= V(M(0)));
}

struct GeluTanhForward {
  template <typename V>
  V operator()(const V& x) const {
    using M = typename V::value_type;
    const V y = x * at::vec::fmadd(V(static_cast<M>(gm::kTanhK * gm::kTanhC)), x * x, V(static_cast<M>(gm::kTanhK)));
    const V e = (y.abs() * V(M(-2))).exp();
    // x * s with s = r or e * r; (x * r) * e stays normal where e * r alone would be subnormal.
    const V xr = x / (V(M(1)) + e);
    return V::blendv(xr * e, xr, y >= V(M(0)));
  }
};

struct GeluTanhBackward {
  template <typename V>
  V operator()(const V& g, const V& x) const {
    using M = typename V::value_type;
    const V x2 = x * x;
    V s, er, r;
    tanh_parts(x, x2, s, er, r);
    // ds/dx = s (1-s) * 2 y' = (er * r) * (2k + 6kc x^2)
    const V dy2 = at::vec::fmadd(V(static_cast<M>(6 * gm::kTanhK * gm::kTanhC)), x2, V(static_cast<M>(2 * gm::kTanhK)));
    return g * at::vec::fmadd(x, (er * r) * dy2, s);
  }
};

// ---- gelu ---------------------------------------------------------------------------------------

at::Tensor gelu(const at::Tensor& x_in, std::string_view approximate) {
  const bool use_tanh = gm::parse_tanh("gelu", approximate);
  check_floating("gelu", "x", x_in);
  const at::Tensor x = densify(x_in);
  at::Tensor y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_gelu_cpu", [&] {
    const std::array<const scalar_t*, 1> in = {x.const_data_ptr<scalar_t>()};
    if (use_tanh) {
      elementwise<scalar_t, 1>(y.data_ptr<scalar_t>(), x.numel(), GeluTanhForward{}, in);
    } else {
      elementwise<scalar_t, 1>(y.data_ptr<scalar_t>(), x.numel(), GeluErfForward<accuracy_for<scalar_t>()>{}, in);
    }
  });
  return y;
}

at::Tensor gelu_backward(const at::Tensor& grad_in, const at::Tensor& x_in, std::string_view approximate) {
  const bool use_tanh = gm::parse_tanh("gelu_backward", approximate);
  check_floating("gelu_backward", "x", x_in);
  check_same_dtype("gelu_backward", "grad_out", grad_in, "x", x_in);
  check_same_shape("gelu_backward", "grad_out", grad_in, "x", x_in);
  const at::Tensor x = densify(x_in);
  const at::Tensor grad = match_layout(grad_in, x);
  at::Tensor dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_gelu_backward_cpu", [&] {
    const std::array<const scalar_t*, 2> in = {grad.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>()};
    if (use_tanh) {
      elementwise<scalar_t, 2>(dx.data_ptr<scalar_t>(), x.numel(), GeluTanhBackward{}, in);
    } else {
      elementwise<scalar_t, 2>(dx.data_ptr<scalar_t>(), x.numel(), GeluErfBackward<Accuracy::kFull>{}, in);
    }
  });
  return dx;
}

// ---- bias_gelu ----------------------------------------------------------------------------------

// Applies f(i, col, len) to every row segment of the flat range [begin, end) of a rows x n matrix.
template <typename F>
inline void for_each_row_segment(int64_t begin, int64_t end, int64_t n, const F& f) {
  int64_t i = begin;
  int64_t col = begin % n;
  while (i < end) {
    const int64_t len = std::min(n - col, end - i);
    f(i, col, len);
    i += len;
    col = 0;
  }
}

// One vector step of the bias loops: count (<= Vectorized<T>::size()) elements of a at p and of
// the opmath bias at b, widened to opmath vectors (two for fp16/bf16) with the bias added.
template <typename T>
struct BiasStep {
  using Vec = at::vec::Vectorized<T>;
  using M = opmath_t<T>;
  using MVec = at::vec::Vectorized<M>;
  static constexpr int64_t kStep = Vec::size();

  static std::pair<MVec, MVec> load_biased(const T* p, const M* b, int64_t count) {
    if constexpr (is_reduced_float_v<T>) {
      auto [lo, hi] = at::vec::convert_to_float<T>(Vec::loadu(p, count));
      constexpr int64_t half = FVec::size();
      const FVec b_lo = FVec::loadu(b, std::min(count, half));
      const FVec b_hi = count > half ? FVec::loadu(b + half, count - half) : FVec(0.0f);
      return {lo + b_lo, hi + b_hi};
    } else {
      return {Vec::loadu(p, count) + MVec::loadu(b, count), MVec(M(0))};
    }
  }
  static std::pair<MVec, MVec> load(const T* p, int64_t count) {
    if constexpr (is_reduced_float_v<T>) {
      const auto [lo, hi] = at::vec::convert_to_float<T>(Vec::loadu(p, count));
      return {lo, hi};
    } else {
      return {Vec::loadu(p, count), MVec(M(0))};
    }
  }
  static void store(T* p, const MVec& lo, const MVec& hi, int64_t count) {
    if constexpr (is_reduced_float_v<T>) {
      at::vec::convert_from_float<T>(lo, hi).store(p, count);
    } else {
      lo.store(p, count);
    }
  }
};

template <typename T, typename Op>
void bias_gelu_forward_loop(T* out, const T* x, const opmath_t<T>* bias, int64_t numel, int64_t n, const Op& op) {
  using S = BiasStep<T>;
  at::parallel_for(0, numel, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for_each_row_segment(begin, end, n, [&](int64_t i, int64_t col, int64_t len) {
      for (int64_t j = 0; j < len; j += S::kStep) {
        const int64_t count = std::min(S::kStep, len - j);
        const auto [lo, hi] = S::load_biased(x + i + j, bias + col + j, count);
        if constexpr (is_reduced_float_v<T>) {
          S::store(out + i + j, op(lo), op(hi), count);
        } else {
          S::store(out + i + j, op(lo), hi, count);
        }
      }
    });
  });
}

// Tiling of the grad_bias reduction; a function of (rows, n) only, so the summation order (and
// with it every bit of grad_bias) does not depend on the number of threads.
constexpr int64_t kColBlock = 1024;
constexpr int64_t kMaxRowBlocks = 64;
constexpr int64_t kMinTileElements = 16384;

template <typename T, typename Op>
void bias_gelu_backward_loop(T* dx, at::Tensor& grad_bias_acc, const T* grad, const T* x, const opmath_t<T>* bias,
                             int64_t rows, int64_t n, const Op& op) {
  using S = BiasStep<T>;
  using M = opmath_t<T>;
  using MVec = at::vec::Vectorized<M>;
  const int64_t col_blocks = div_up(n, kColBlock);
  const int64_t min_rows = (kMinTileElements + std::min(n, kColBlock) - 1) / std::min(n, kColBlock);
  const int64_t row_blocks = std::clamp<int64_t>(rows / std::max<int64_t>(min_rows, 1), 1, kMaxRowBlocks);
  const int64_t rows_per_block = (rows + row_blocks - 1) / row_blocks;
  at::Tensor partial = at::empty({row_blocks, n}, grad_bias_acc.options());
  M* partial_ptr = partial.data_ptr<M>();

  at::parallel_for(0, row_blocks * col_blocks, 1, [&](int64_t task_begin, int64_t task_end) {
    alignas(64) M acc[kColBlock];
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t rb = task / col_blocks, cb = task % col_blocks;
      const int64_t c0 = cb * kColBlock, width = std::min(kColBlock, n - c0);
      const int64_t r0 = rb * rows_per_block, r1 = std::min(rows, r0 + rows_per_block);
      std::fill(acc, acc + width, M(0));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t base = r * n + c0;
        for (int64_t j = 0; j < width; j += S::kStep) {
          const int64_t count = std::min(S::kStep, width - j);
          const auto [h_lo, h_hi] = S::load_biased(x + base + j, bias + c0 + j, count);
          const auto [g_lo, g_hi] = S::load(grad + base + j, count);
          const MVec d_lo = op(g_lo, h_lo);
          // Accumulate the unrounded fp32 gradient: grad_bias is then the fp32 sum of exact terms.
          constexpr int64_t mstep = MVec::size();
          (MVec::loadu(acc + j, std::min(count, mstep)) + d_lo).store(acc + j, std::min(count, mstep));
          if constexpr (is_reduced_float_v<T>) {
            const MVec d_hi = op(g_hi, h_hi);
            if (count > mstep) {
              (MVec::loadu(acc + j + mstep, count - mstep) + d_hi).store(acc + j + mstep, count - mstep);
            }
            S::store(dx + base + j, d_lo, d_hi, count);
          } else {
            S::store(dx + base + j, d_lo, d_lo, count);
          }
        }
      }
      std::copy(acc, acc + width, partial_ptr + rb * n + c0);
    }
  });

  sum_rows_in_order(partial_ptr, row_blocks, n, grad_bias_acc.data_ptr<M>());
}

at::Tensor bias_gelu(const at::Tensor& x_in, const at::Tensor& bias_in, std::string_view approximate) {
  const bool use_tanh = gm::parse_tanh("bias_gelu", approximate);
  gm::check_bias_args("bias_gelu", x_in, bias_in);
  const at::Tensor x = x_in.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  const int64_t n = x.size(-1);
  if (x.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_bias_gelu_cpu", [&] {
    using M = opmath_t<scalar_t>;
    const at::Tensor bias = bias_in.to(c10::CppTypeToScalarType<M>::value).contiguous();
    if (use_tanh) {
      bias_gelu_forward_loop(y.data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), bias.const_data_ptr<M>(), x.numel(),
                             n, GeluTanhForward{});
    } else {
      bias_gelu_forward_loop(y.data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), bias.const_data_ptr<M>(), x.numel(),
                             n, GeluErfForward<accuracy_for<scalar_t>()>{});
    }
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad_in, const at::Tensor& x_in,
                                                      const at::Tensor& bias_in, std::string_view approximate) {
  const bool use_tanh = gm::parse_tanh("bias_gelu_backward", approximate);
  gm::check_bias_args("bias_gelu_backward", x_in, bias_in);
  check_same_dtype("bias_gelu_backward", "grad_out", grad_in, "x", x_in);
  check_same_shape("bias_gelu_backward", "grad_out", grad_in, "x", x_in);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor grad = grad_in.contiguous();
  at::Tensor dx = at::empty(x.sizes(), x.options());
  const int64_t n = x.size(-1);
  if (x.numel() == 0) return {dx, at::zeros_like(bias_in)};
  at::Tensor grad_bias;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_bias_gelu_backward_cpu", [&] {
    using M = opmath_t<scalar_t>;
    const auto opmath_dtype = c10::CppTypeToScalarType<M>::value;
    const at::Tensor bias = bias_in.to(opmath_dtype).contiguous();
    at::Tensor acc = at::empty({n}, x.options().dtype(opmath_dtype));
    const int64_t rows = x.numel() / n;
    if (use_tanh) {
      bias_gelu_backward_loop(dx.data_ptr<scalar_t>(), acc, grad.const_data_ptr<scalar_t>(),
                              x.const_data_ptr<scalar_t>(), bias.const_data_ptr<M>(), rows, n, GeluTanhBackward{});
    } else {
      bias_gelu_backward_loop(dx.data_ptr<scalar_t>(), acc, grad.const_data_ptr<scalar_t>(),
                              x.const_data_ptr<scalar_t>(), bias.const_data_ptr<M>(), rows, n,
                              GeluErfBackward<Accuracy::kFull>{});
    }
    grad_bias = acc.to(x.scalar_type());
  });
  return {dx, grad_bias};
}

}  // namespace
}  // namespace fastops::cpu

TORCH_LIBRARY_IMPL(fastops, CPU, m) {
  m.impl("gelu", &fastops::cpu::gelu);
  m.impl("gelu_backward", &fastops::cpu::gelu_backward);
  m.impl("bias_gelu", &fastops::cpu::bias_gelu);
  m.impl("bias_gelu_backward", &fastops::cpu::bias_gelu_backward);
}
