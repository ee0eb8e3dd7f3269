// GELU pieces shared by the CPU and CUDA kernels: constants, the erf-tail approximation, the
// string -> form parsing and the bias_gelu argument checks. Scalar functions are host+device so the CUDA kernels use
// the same math.
//
// The erf form is written through the upper tail of the normal distribution,
//   T(u) = P(Z > u) = 0.5 * erfc(u / sqrt2) = exp(-u^2/2) * Q(u),  u = |x|,
//   gelu(x) = x * Phi(x) = x >= 0 ? x * (1 - T(u)) : x * T(u),
// so neither branch subtracts nearly equal numbers: eager's 0.5 * x * (1 + erf(x / sqrt2)) loses
// every digit for x < -5 in fp32 (1 + erf rounds to 0 or to a few ulp of 1). Q(u) = 0.5 *
// erfcx(u / sqrt2) is smooth and slowly varying; with t = 1 / (1 + a u) in (0, 1] we fit
// Q = t * P9(t), P9 a degree-9 polynomial, over the whole half line (t = 0 is u = inf). The
// coefficients are our own weighted least-squares fit (iteratively reweighted towards minimax) of
// the relative error against scipy's erfcx in float64: max relative error of Q 2.6e-8 (below half
// an fp32 ulp) for every u >= 0. exp(-u^2/2) is evaluated with u^2 split exactly into hi + lo
// (one FMA), so the large argument carries no rounding error of its own: the result is within a
// few fp32 ulp of the float64 value for every x down to where it underflows (x ~ -14).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <fastops/checks.h>

#include <array>
#include <cmath>
#include <string_view>

namespace fastops::gelu_math {

// sqrt(2/pi) and 0.044715: the tanh form's constants (as torch writes them).
constexpr double kTanhK = 0.7978845608028654;
constexpr double kTanhC = 0.044715;
constexpr double kSqrtHalf = 0.7071067811865476;    // 1/sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/sqrt(2 pi)

// Q(u) = t * (kP0 + kP1 t + ... + kP9 t^9) with t = 1 / (1 + kTailA * u): see the file comment.
constexpr float kTailA = 0.252f;
constexpr float kP0 = 1.005334556e-01f, kP1 = 1.005341262e-01f, kP2 = 9.412071109e-02f, kP3 = 8.184565604e-02f,
                kP4 = 5.963029712e-02f, kP5 = 6.050679833e-02f, kP6 = -2.663252503e-02f, kP7 = 8.795514703e-02f,
                kP8 = -7.829092443e-02f, kP9 = 1.979727298e-02f;

// The Horner chain, written once for a float or a Vectorized<float> (fma: fmaf or at::vec::fmadd).
template <typename V, typename Fma>
C10_HOST_DEVICE inline V tail_poly(const V& t, Fma fma) {
  V p = fma(V(kP9), t, V(kP8));
  p = fma(p, t, V(kP7));
  p = fma(p, t, V(kP6));
  p = fma(p, t, V(kP5));
  p = fma(p, t, V(kP4));
  p = fma(p, t, V(kP3));
  p = fma(p, t, V(kP2));
  p = fma(p, t, V(kP1));
  return fma(p, t, V(kP0));
}
// The bulk |x| <= kBulkLimit, where almost every activation lies: Q(u) = N(u) / D(u), a rational fit
// on [0, kBulkLimit] (our own: linear-programming minimax of the relative error against scipy's
// erfcx in float64, then rounded to fp32), low to high, D monic. Full: degree (4, 4), 7.9e-8; reduced
// (fp16/bf16 outputs of the forward): degree (2, 3), 9.5e-6. Used by the CPU kernels' bulk path and
// by the CUDA forward for fp16/bf16 outputs.
constexpr float kBulkLimit = 7.0f;
constexpr std::array<float, 5> kBulkN = {1.671565247e+01f, 1.058711720e+01f, 3.209682703e+00f, 3.979189992e-01f,
                                         3.068713704e-05f};
constexpr std::array<float, 4> kBulkD = {3.343130493e+01f, 4.784848022e+01f, 2.788196945e+01f, 8.007079124e+00f};
constexpr std::array<float, 3> kBulkNReduced = {3.628929138e+00f, 1.885877252e+00f, 4.001633525e-01f};
constexpr std::array<float, 3> kBulkDReduced = {7.257789612e+00f, 9.565021515e+00f, 4.789812565e+00f};

// The erf form's derivative (the CPU bulk backward, every dtype; the CUDA backward for fp16/bf16 outputs),
// in a form with no cancellation: with u = |x|, E = exp(-u^2/2) and k(u) = T(u) / E - u / sqrt(2 pi)
// (T = 0.5 erfc(u / sqrt 2)), gelu'(x) = 1 - E k for x >= 0 and E k for x < 0. k has its one root at u0 =
// 0.75179152469356425, where gelu'(-u0) = 0 and the sum T - u phi cancels; so k = (u0 - u) r(u) with r smooth and
// positive (0.438 to 0.665 on [0, kBulkLimit]), and u0 - u is exact near the root (u0 split hi + lo). r = N / D: a
// rational fit on [0, kBulkLimit] (linear-programming minimax of the relative error against scipy's erfcx in float64,
// then rounded to fp32), low to high, D monic: degree (3, 3), 3.0e-7.
constexpr std::array<float, 2> kGradRoot = {7.517915368e-01f, -1.211444967e-08f};
constexpr std::array<float, 4> kGradRatioN = {7.745461996e+00f, 7.061299755e+00f, 2.681662736e+00f, 3.988535736e-01f};
constexpr std::array<float, 3> kGradRatioD = {1.164594354e+01f, 1.371068558e+01f, 5.964612110e+00f};

// Beyond this |x| exp(-x^2/2) is 0 in fp32; clamping there keeps x*x (and its exact low part) finite.
constexpr float kTailClamp = 20.0f;

// "none" -> false, "tanh" -> true; anything else is a user error naming the op.
inline bool parse_tanh(const char* op, std::string_view approximate) {
  FASTOPS_CHECK_ARG(approximate == "none" || approximate == "tanh", "fastops.", op,
                    ": expected approximate to be 'none' or 'tanh', got '", std::string(approximate), "'");
  return approximate == "tanh";
}

// bias_gelu's argument checks, shared by the CPU and CUDA kernels (the fake kernels in
// fastops/ops/gelu.py check the shapes alike).
inline void check_bias_args(const char* op, const at::Tensor& x, const at::Tensor& bias) {
  check_floating(op, "x", x);
  FASTOPS_CHECK_SHAPE(x.dim() >= 1, "fastops.", op, ": expected x to have at least one dimension, got a 0-d tensor");
  FASTOPS_CHECK_SHAPE(bias.dim() == 1 && bias.size(0) == x.size(-1), "fastops.", op,
                      ": expected bias to be 1-D with x.shape[-1] = ", str(x.size(-1)), " elements, got shape ",
                      str(bias.sizes()));
  check_same_dtype(op, "bias", bias, "x", x);
  check_same_device(op, "bias", bias, "x", x);
}

// Scalar fp32 versions (CUDA kernels).
struct ScalarFma {
  C10_HOST_DEVICE float operator()(float a, float b, float c) const { return fmaf(a, b, c); }
};

C10_HOST_DEVICE inline float tail_q(float u) {
  const float t = 1.0f / fmaf(kTailA, u, 1.0f);
  return t * tail_poly(t, ScalarFma{});
}

// exp(-u^2/2) with u^2 = hi + lo exactly: exp(-hi/2) * (1 - lo/2).
C10_HOST_DEVICE inline float gauss(float u) {
  u = fminf(u, kTailClamp);
  const float hi = u * u;
  const float lo = fmaf(u, u, -hi);
  const float e = expf(-0.5f * hi);
  return fmaf(e, -0.5f * lo, e);
}

}  // namespace fastops::gelu_math
