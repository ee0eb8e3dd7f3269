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

#include <array>
#include <string_view>
#include <tuple>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

namespace gm = fastops::gelu_math;
using DVec = at::vec::Vectorized<double>;

// Q(u) = t * P(t), t = 1 / (1 + a u): gelu_math.h's degree-9 fit, or a degree-6 one (kReduced,
// 3.7e-6 relative). The erf form runs kFull for fp32 and fp64 outputs and for every backward's Q
// (Phi + x phi cancels near x = -0.75, so the gradient needs Q to fp32 accuracy whatever the output
// dtype), kReduced for the fp16/bf16 forward (with gauss's reduced exp: ~1e-5 relative in all, 7
// instructions cheaper per vector) and for the fp16/bf16 backward's exp(-x^2/2), which only scales
// the cancelled difference (bulk_gelu_grad).
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

// c[0] + c[1] u + ... (monic: plus u^N).
template <size_t N, bool kMonic = false>
inline FVec horner(const std::array<float, N>& c, const FVec& u) {
  FVec p = kMonic ? u + FVec(c[N - 1]) : at::vec::fmadd(FVec(c[N - 1]), u, FVec(c[N - 2]));
  constexpr size_t first = kMonic ? N - 1 : N - 2;
  for (size_t i = first; i-- > 0;) p = at::vec::fmadd(p, u, FVec(c[i]));
  return p;
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

// k = Q(u) - u / sqrt(2 pi) = (u0 - u) r(u) for 0 <= u <= kBulkLimit: gelu_math.h's root-factored form,
// shared with the CUDA fp16/bf16 backward. Q - u / sqrt(2 pi) written out cancels at the root u0 =
// 0.7518 (Q's error is amplified without bound there, 7.9e-6 relative 0.01 away); u0 - u is exact
// near it, so the gradient keeps its relative accuracy everywhere, and r, degree (3, 3), costs two
// FMAs fewer than Q.
inline FVec root_factored_k(const FVec& u) {
  const FVec root_gap = (FVec(gm::kGradRoot[0]) - u) + FVec(gm::kGradRoot[1]);
  return root_gap * (horner(gm::kGradRatioN, u) / horner<gm::kGradRatioD.size(), true>(gm::kGradRatioD, u));
}

// ---- erf form: the bulk |x| <= kBulkLimit (AVX2 / AVX-512) ----------------------------------------
// Almost every activation lies in |x| <= 7 (a 16-lane vector of N(0, 2^2) values leaves it 0.7% of the
// time), so the kernels test each vector once and take a cheaper evaluation when every lane is in
// range; the general one above (clamps, the whole half line, inf and NaN) runs only for the rest.
// The bulk writes T(u) = exp(-u^2/2) * Q(u) too, with
//   Q(u) = N(u) / D(u): gelu_math.h's rational fit on [0, 7]. kFull: degree (4, 4), fit 7.9e-8,
//     ~3e-7 after the fp32 roundings of the two Horner chains and the division (the general path's
//     t = 1/(1 + a u) amplifies the rounding of t up to 3x near u = 0). kReduced (fp16/bf16
//     outputs): degree (2, 3), 9.5e-6.
//   exp(-u^2/2) = 2^(-n/M) * exp(-s/2), n = round(u^2 M / (2 ln2)), s = u^2 - n c in [-ln2/M, ln2/M]
//     with c = kExpStep, the fp32 value of 2 ln2 / M (u^2 = hi + lo exactly, as in gauss, and n c exact
//     inside the FMA; c's own error, 2.7e-9 relative, moves s by at most 1.4e-7 at u = 7: <= 6.7e-8
//     relative in the result, one FMA cheaper than carrying c's low part), 2^(-j/M) for j = n mod M
//     from an M-entry register table (one permute: M = 16 AVX-512, 8 AVX2) held as hi + lo so that
//     exp(-s/2) = 1 + s p(s) enters as hi + (hi s p(s) + lo) with one final rounding, and
//     2^(-floor(n/M)) applied as an integer subtraction from the exponent (the result stays normal:
//     exp(-49/2) > 1e-11). p is of degree 2 (M = 16: 4.4e-9; M = 8: 2.7e-8, where degree 3 cost an FMA
//     for 6.2e-10); kReduced: degree 1, no lo parts (4.3e-7 / 3.5e-6).
//   gelu(x) = max(x, 0) - (u q) exp(-u^2/2): one FMA for both signs (x < 0: x T(u); x >= 0: x - x T(u)),
//     max(0, x) keeps gelu(-0.0) = -0.0.
// 17 FMA-port instructions, one division and two permutes per vector (kFull), against 29 and a division
// for the general path. Exhaustively over every fp32 x with |x| <= 7: at most 6.8 ulp from the float64
// value (AVX2; AVX-512 6.6); the general path (the rest of [-20, 10]): 7.6 over every 16th value.
// (git show 00da02d:benchmarks/results/gelu_cpu_avx2_fma_count.md)
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#define FASTOPS_GELU_BULK 1

using gm::kBulkD;
using gm::kBulkDReduced;
using gm::kBulkLimit;
using gm::kBulkN;
using gm::kBulkNReduced;

#if defined(CPU_CAPABILITY_AVX512)
constexpr int kExpTableBits = 4;
alignas(64) constexpr float kExpHi[16] = {1.000000000e+00f, 9.576032758e-01f, 9.170040488e-01f, 8.781260848e-01f,
                                          8.408964276e-01f, 8.052451611e-01f, 7.711054087e-01f, 7.384130955e-01f,
                                          7.071067691e-01f, 6.771277785e-01f, 6.484197974e-01f, 6.209288836e-01f,
                                          5.946035385e-01f, 5.693942904e-01f, 5.452538729e-01f, 5.221368670e-01f};
alignas(64) constexpr float kExpLo[16] = {0.000000000e+00f,  4.922664054e-09f,  -5.619638976e-09f, -4.617885185e-09f,
                                          -1.237766334e-08f, 4.918108587e-09f,  4.035452417e-09f,  -2.250449427e-08f,
                                          1.210161749e-08f,  -5.061674635e-09f, -2.009499767e-08f, 2.248419051e-08f,
                                          1.898817636e-08f,  2.693111156e-08f,  -6.538769970e-09f, 2.416735079e-08f};
constexpr float kExpStep = 8.664339781e-02f, kExpInvStep = 1.154156017e+01f;
constexpr std::array<float, 3> kExpP = {-5.000001192e-01f, 1.250049025e-01f, -2.078015171e-02f};
constexpr std::array<float, 2> kExpPReduced = {-5.000293255e-01f, 1.249999702e-01f};
#else
constexpr int kExpTableBits = 3;
alignas(32) constexpr float kExpHi[8] = {1.000000000e+00f, 9.170040488e-01f, 8.408964276e-01f, 7.711054087e-01f,
                                         7.071067691e-01f, 6.484197974e-01f, 5.946035385e-01f, 5.452538729e-01f};
alignas(32) constexpr float kExpLo[8] = {0.000000000e+00f, -5.619638976e-09f, -1.237766334e-08f, 4.035452417e-09f,
                                         1.210161749e-08f, -2.009499767e-08f, 1.898817636e-08f,  -6.538769970e-09f};
constexpr float kExpStep = 1.732867956e-01f, kExpInvStep = 5.770780087e+00f;
constexpr std::array<float, 3> kExpP = {-5.000000000e-01f, 1.250162423e-01f, -2.083037421e-02f};
constexpr std::array<float, 2> kExpPReduced = {-5.000995994e-01f, 1.244387180e-01f};
#endif
// 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
constexpr float kRoundShift = 12582912.0f;

// Every lane of u <= c (false for NaN).
inline bool all_le(const FVec& u, float c) {
#if defined(CPU_CAPABILITY_AVX512)
  const __mmask16 m = _mm512_cmp_ps_mask(u, _mm512_set1_ps(c), _CMP_LE_OQ);
  return _kortestc_mask16_u8(m, m);
#else
  return _mm256_movemask_ps(_mm256_cmp_ps(u, _mm256_set1_ps(c), _CMP_LE_OQ)) == 0xFF;
#endif
}

// table[bits of idx mod table size]
inline FVec lookup(const float* table, const FVec& idx) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_permutexvar_ps(_mm512_castps_si512(idx), _mm512_load_ps(table));
#else
  return _mm256_permutevar8x32_ps(_mm256_load_ps(table), _mm256_castps_si256(idx));
#endif
}

// v * 2^-k for k = (bits of kf) >> kExpTableBits = floor(n / M), by subtracting k from the exponent
// field (v and the result normal). The low bits of kf's pattern are n + 2^22; 2^22 >> 4 or >> 3 is a
// multiple of 2^9 and so vanishes in the shift by 23.
inline FVec scale_down(const FVec& v, const FVec& kf) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512i k = _mm512_slli_epi32(_mm512_srli_epi32(_mm512_castps_si512(kf), kExpTableBits), 23);
  return _mm512_castsi512_ps(_mm512_sub_epi32(_mm512_castps_si512(v), k));
#else
  const __m256i k = _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(kf), kExpTableBits), 23);
  return _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_castps_si256(v), k));
#endif
}

// max(0, x), and -0.0 for x = -0.0 (maxps returns its second operand when both are zero).
inline FVec max_zero(const FVec& x) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_max_ps(_mm512_setzero_ps(), x);
#else
  return _mm256_max_ps(_mm256_setzero_ps(), x);
#endif
}

// x < 0 (sign bit set, -0.0 included) ? a : b
inline FVec select_negative(const FVec& x, const FVec& a, const FVec& b) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_mask_mov_ps(b, _mm512_movepi32_mask(_mm512_castps_si512(x)), a);
#else
  return _mm256_blendv_ps(b, a, x);
#endif
}

template <Accuracy kAcc>
C10_ALWAYS_INLINE FVec bulk_q(const FVec& u) {
  if constexpr (kAcc == Accuracy::kFull) {
    return horner(kBulkN, u) / horner<kBulkD.size(), true>(kBulkD, u);
  } else {
    return horner(kBulkNReduced, u) / horner<kBulkDReduced.size(), true>(kBulkDReduced, u);
  }
}

// exp(-u^2/2) for 0 <= u <= kBulkLimit: see the section comment.
template <Accuracy kAcc>
C10_ALWAYS_INLINE FVec bulk_gauss(const FVec& u) {
  const FVec hi = u * u;
  const FVec kf = at::vec::fmadd(hi, FVec(kExpInvStep), FVec(kRoundShift));
  const FVec n = kf - FVec(kRoundShift);
  FVec s = fnmadd(n, FVec(kExpStep), hi);  // exact: |s| <= ln2/M and n * kExpStep is exact in the FMA
  const FVec th = lookup(kExpHi, kf);
  FVec e;
  if constexpr (kAcc == Accuracy::kFull) {
    s = s + at::vec::fmsub(u, u, hi);
    e = at::vec::fmadd(th * s, horner(kExpP, s), lookup(kExpLo, kf)) + th;
  } else {
    e = at::vec::fmadd(th * s, horner(kExpPReduced, s), th);
  }
  return scale_down(e, kf);
}

template <Accuracy kAcc>
C10_ALWAYS_INLINE FVec bulk_gelu(const FVec& x, const FVec& u) {
  return fnmadd(u * bulk_q<kAcc>(u), bulk_gauss<kAcc>(u), max_zero(x));
}

// gelu'(x) = Phi(x) + x phi(x) = E k (x < 0) or 1 - E k (x >= 0), E = exp(-u^2/2) and
// k = Q(u) - u / sqrt(2 pi) = (u0 - u) r(u): root_factored_k below. The Gaussian only scales k and
// takes kAcc (fp16/bf16 outputs: kReduced, ~1e-5).
template <Accuracy kAcc>
C10_ALWAYS_INLINE FVec bulk_gelu_grad(const FVec& x, const FVec& u) {
  const FVec z = bulk_gauss<kAcc>(u) * root_factored_k(u);
  return select_negative(x, z, FVec(1.0f) - z);
}
#endif

// The bulk test inlined into the loop, the general path out of line: it runs for few vectors, and
// inlining both (twice per fp16/bf16 step) made the compiler outline the whole op instead.
#ifdef FASTOPS_GELU_BULK
#define FASTOPS_GELU_GENERAL C10_NOINLINE
#else
#define FASTOPS_GELU_GENERAL
#endif

template <Accuracy kAcc>
struct GeluErfForward {
  C10_ALWAYS_INLINE FVec operator()(const FVec& x) const {
#ifdef FASTOPS_GELU_BULK
    const FVec u = x.abs();
    if (C10_LIKELY(all_le(u, kBulkLimit))) return bulk_gelu<kAcc>(x, u);
#endif
    return general(x);
  }
  FASTOPS_GELU_GENERAL static FVec general(FVec x) {
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
  C10_ALWAYS_INLINE FVec operator()(const FVec& g, const FVec& x) const {
#ifdef FASTOPS_GELU_BULK
    const FVec u = x.abs();
    if (C10_LIKELY(all_le(u, kBulkLimit))) return g * bulk_gelu_grad<kAcc>(x, u);
#endif
    return general(g, x);
  }
  FASTOPS_GELU_GENERAL static FVec general(FVec g, FVec x) {
    FVec ex, q;
    erf_tail_parts<Accuracy::kFull>(x, ex, q);  // (the deep tail: few vectors, kept full)
    const FVec tail = q * ex;
    const FVec cdf = FVec::blendv(tail, FVec(1.0f) - tail, x >= FVec(0.0f));
    const FVec summed = at::vec::fmadd(x, ex * FVec(static_cast<float>(gm::kInvSqrt2Pi)), cdf);
    // The sum cancels at x = -u0 (its relative error ~8e-8 / |u - u0|): lanes within 0.5 of the root
    // take the root-factored form (every such lane at the DEFAULT level, which has no bulk path; at the
    // others, one in a vector that also holds a tail value). Elsewhere the sum is accurate, and exact
    // where it should be (1/2 at x = 0, where the fit of r is 2.4e-7 off).
    const FVec u = x.abs();
    const FVec z = ex * root_factored_k(u);
    const FVec factored = FVec::blendv(FVec(1.0f) - z, z, x < FVec(0.0f));
    return g * FVec::blendv(summed, factored, (u - FVec(gm::kGradRoot[0])).abs() <= FVec(0.5f));
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

}  // namespace

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
      elementwise<scalar_t, 2>(dx.data_ptr<scalar_t>(), x.numel(), GeluErfBackward<accuracy_for<scalar_t>()>{}, in);
    }
  });
  return dx;
}

namespace {

// ---- bias_gelu ----------------------------------------------------------------------------------

// Applies f(i, col, len) to every row segment of the flat range [begin, end) of a rows x n matrix.
template <typename F>
C10_ALWAYS_INLINE void for_each_row_segment(int64_t begin, int64_t end, int64_t n, const F& f) {
  int64_t i = begin;
  int64_t col = begin % n;
  while (i < end) {
    const int64_t len = std::min(n - col, end - i);
    f(i, col, len);
    i += len;
    col = 0;
  }
}

// One vector step of the bias loops: count (<= Vectorized<T>::size()) elements of T, or of the opmath
// bias, widened to opmath vectors (two for fp16/bf16, the second unused otherwise), and the store back.
template <typename T>
struct BiasStep {
  using Vec = at::vec::Vectorized<T>;
  using M = opmath_t<T>;
  using MVec = at::vec::Vectorized<M>;
  static constexpr int64_t kStep = Vec::size();

  static C10_ALWAYS_INLINE std::pair<MVec, MVec> load(const T* p, int64_t count) {
    if constexpr (is_reduced_float_v<T>) {
      const auto [lo, hi] = at::vec::convert_to_float<T>(Vec::loadu(p, count));
      return {lo, hi};
    } else {
      return {Vec::loadu(p, count), MVec(M(0))};
    }
  }
  static C10_ALWAYS_INLINE std::pair<MVec, MVec> load_opmath(const M* b, int64_t count) {
    if constexpr (is_reduced_float_v<T>) {
      constexpr int64_t half = MVec::size();
      return {MVec::loadu(b, std::min(count, half)), count > half ? MVec::loadu(b + half, count - half) : MVec(0.0f)};
    } else {
      return {MVec::loadu(b, count), MVec(M(0))};
    }
  }
  static C10_ALWAYS_INLINE void store_opmath(M* b, const MVec& lo, const MVec& hi, int64_t count) {
    constexpr int64_t half = MVec::size();
    lo.store(b, std::min(count, half));
    if (is_reduced_float_v<T> && count > half) hi.store(b + half, count - half);
  }
  template <typename Narrow>
  static C10_ALWAYS_INLINE void store(T* p, const MVec& lo, const MVec& hi, int64_t count, const Narrow& narrow) {
    if constexpr (is_reduced_float_v<T>) {
      narrow(lo, hi).store(p, count);
    } else {
      lo.store(p, count);
    }
  }
};

constexpr int64_t kPrefetchBytes = 2048;

template <typename T, typename Op, typename Narrow>
void bias_gelu_forward_loop(T* out, const T* x, const opmath_t<T>* bias, int64_t numel, int64_t n, const Op& op,
                            const Narrow& narrow) {
  using S = BiasStep<T>;
  at::parallel_for(0, numel, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    // Local copies, so that the stores through dst cannot alias them (see elementwise).
    T* const dst = out;
    const T* const src = x;
    const opmath_t<T>* const b = bias;
    const auto vector_at = [&](int64_t i, int64_t col, int64_t count) C10_ALWAYS_INLINE_ATTRIBUTE {
      const auto [x_lo, x_hi] = S::load(src + i, count);
      const auto [b_lo, b_hi] = S::load_opmath(b + col, count);
      if constexpr (is_reduced_float_v<T>) {
        S::store(dst + i, op(x_lo + b_lo), op(x_hi + b_hi), count, narrow);
      } else {
        S::store(dst + i, op(x_lo + b_lo), x_hi, count, narrow);
      }
    };
    for_each_row_segment(begin, end, n, [&](int64_t i, int64_t col, int64_t len) C10_ALWAYS_INLINE_ATTRIBUTE {
      int64_t j = 0;
      for (; j + S::kStep <= len; j += S::kStep) {
        // x's lines requested 2 KiB ahead: with a wide bias in L1 beside the x and y streams (16 KiB
        // of fp32 at 4096 columns) the loads of x stalled, and the forward ran 20-27% slower than
        // gelu alone at 4096 columns (6.5% at 1024). Measured: 6-8% off on AVX-512, 12-20% on AVX2
        // (git show 00da02d:benchmarks/results/gelu_cpu_issue16_c.md).
        __builtin_prefetch(reinterpret_cast<const char*>(src + i + j) + kPrefetchBytes);
        vector_at(i + j, col + j, S::kStep);
      }
      if (j < len) vector_at(i + j, col + j, len - j);
    });
  });
}

// Tiling of the grad_bias reduction; a function of (rows, n) only, so the summation order (and
// with it every bit of grad_bias) does not depend on the number of threads. Column blocks as wide as
// a 4096-feature row (a 16 KiB fp32 accumulator): with 1024 a tile read its three streams in 4 KiB
// pieces 16 KiB apart, which the prefetchers follow badly (fp32 1024x4096 backward ~4.1 -> ~3.5 ms).
// Within a tile the rows are walked one at a time, in order, each as one stream of x, g and dx, with the
// bias and the accumulator read from L1. (Four rows down each column vector together, which kept the
// bias and the accumulator in registers, ran 12 streams 8-16 KiB apart and spilled: one row at a time,
// the AVX-512 bf16 1024x4096 backward 2.15 -> 1.24 ms, AVX2 fp32 2.76 -> 2.38 ms; the AVX-512 fp32 one,
// memory-bound, unchanged; git show 00da02d:benchmarks/results/gelu_cpu_bias_rows_zen5.md.)
constexpr int64_t kColBlock = 4096;
constexpr int64_t kMaxRowBlocks = 64;
constexpr int64_t kMinTileElements = 16384;

template <typename T, typename Op, typename Narrow>
void bias_gelu_backward_loop(T* dx, at::Tensor& grad_bias_acc, const T* grad, const T* x, const opmath_t<T>* bias,
                             int64_t rows, int64_t n, const Op& op, const Narrow& narrow) {
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
    // Local copies, so that the stores through dx_out cannot alias them (see elementwise).
    T* const dx_out = dx;
    const T* const g_in = grad;
    const T* const x_in = x;
    const M* const b = bias;
    const int64_t stride = n;
    alignas(64) M acc[kColBlock];
    // count elements of one row at offset off, bias bv: grad_x, added to the accumulator pair a.
    const auto row_at = [&](int64_t off, const auto& bv, auto& a, int64_t count) C10_ALWAYS_INLINE_ATTRIBUTE {
      // As in the forward: x and g requested ahead (13-14% off the AVX-512 bf16 backward).
      __builtin_prefetch(reinterpret_cast<const char*>(x_in + off) + kPrefetchBytes);
      __builtin_prefetch(reinterpret_cast<const char*>(g_in + off) + kPrefetchBytes);
      const auto [x_lo, x_hi] = S::load(x_in + off, count);
      const auto [g_lo, g_hi] = S::load(g_in + off, count);
      // Accumulate the unrounded fp32 gradient: grad_bias is then the fp32 sum of exact terms.
      if constexpr (is_reduced_float_v<T>) {
        const MVec d_lo = op(g_lo, x_lo + bv.first);
        const MVec d_hi = op(g_hi, x_hi + bv.second);
        a.first = a.first + d_lo;
        a.second = a.second + d_hi;
        S::store(dx_out + off, d_lo, d_hi, count, narrow);
      } else {
        const MVec d = op(g_lo, x_lo + bv.first);
        a.first = a.first + d;
        S::store(dx_out + off, d, d, count, narrow);
      }
    };
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t rb = task / col_blocks, cb = task % col_blocks;
      const int64_t c0 = cb * kColBlock, width = std::min(kColBlock, n - c0);
      const int64_t r0 = rb * rows_per_block, r1 = std::min(rows, r0 + rows_per_block);
      // Row r at columns c0 + j + [0, count).
      const auto vector_at = [&](int64_t r, int64_t j, int64_t count) C10_ALWAYS_INLINE_ATTRIBUTE {
        const auto bv = S::load_opmath(b + c0 + j, count);
        auto a = S::load_opmath(acc + j, count);
        row_at(r * stride + c0 + j, bv, a, count);
        S::store_opmath(acc + j, a.first, a.second, count);
      };
      std::fill(acc, acc + width, M(0));
      for (int64_t r = r0; r < r1; ++r) {
        int64_t j = 0;
        for (; j + S::kStep <= width; j += S::kStep) vector_at(r, j, S::kStep);
        if (j < width) vector_at(r, j, width - j);
      }
      std::copy(acc, acc + width, partial_ptr + rb * n + c0);
    }
  });

  sum_rows_in_order(partial_ptr, row_blocks, n, grad_bias_acc.data_ptr<M>());
}

}  // namespace

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
    with_narrowing<scalar_t>([&](const auto narrow) {
      if (use_tanh) {
        bias_gelu_forward_loop(y.data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), bias.const_data_ptr<M>(),
                               x.numel(), n, GeluTanhForward{}, narrow);
      } else {
        bias_gelu_forward_loop(y.data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(), bias.const_data_ptr<M>(),
                               x.numel(), n, GeluErfForward<accuracy_for<scalar_t>()>{}, narrow);
      }
    });
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
    with_narrowing<scalar_t>([&](const auto narrow) {
      if (use_tanh) {
        bias_gelu_backward_loop(dx.data_ptr<scalar_t>(), acc, grad.const_data_ptr<scalar_t>(),
                                x.const_data_ptr<scalar_t>(), bias.const_data_ptr<M>(), rows, n, GeluTanhBackward{},
                                narrow);
      } else {
        bias_gelu_backward_loop(dx.data_ptr<scalar_t>(), acc, grad.const_data_ptr<scalar_t>(),
                                x.const_data_ptr<scalar_t>(), bias.const_data_ptr<M>(), rows, n,
                                GeluErfBackward<accuracy_for<scalar_t>()>{}, narrow);
      }
    });
    grad_bias = acc.to(x.scalar_type());
  });
  return {dx, grad_bias};
}

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
