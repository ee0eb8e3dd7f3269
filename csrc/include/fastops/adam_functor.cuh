// The Adam / AdamW update as a multi-tensor-apply functor (math: cpu/fused_adam.cpp).
//
// Lists: param, exp_avg, exp_avg_sq[, max_exp_avg_sq], grad; per tensor: its step, read on the device
// (the count before this call). Per chunk, the broadcast coefficients are computed in double from the
// tensor's own step and lr, and rounded to fp32 once; the per-element math runs in fp32 for every
// dtype. step, grad_scale, found_inf and an lr tensor are read on the device: no host sync, so a step
// can be captured in a CUDA graph. When *found_inf != 0 every block returns before touching memory.
// Bytes per element: 7 * sizeof(T) (28 B fp32: read p, g, m, v; write p, m, v); amsgrad + 2 * sizeof(T),
// grad_scale + sizeof(T) (the unscaled grad written back).
#pragma once

#include <fastops/adam.h>
#include <fastops/multi_tensor_apply.cuh>

namespace fastops::cuda {

struct AdamArgs {
  double lr, beta1, beta2, weight_decay, eps;
  const float* lr_ptr;      // replaces lr when set
  const float* grad_scale;  // divides the grads (written back unscaled) when set
  const float* found_inf;   // skips everything when set and nonzero
  bool maximize;
};

// Broadcast coefficients of one tensor, computed in double from its own step and rounded once.
struct AdamCoeffs {
  float grad_scale, weight_decay, decay_factor, lerp_coeff, beta2, one_minus_beta2, bias_correction2, eps,
      neg_step_size;
  bool unscale, maximize, lerp_from_start;
};

template <adam::Decay kDecay, bool kAmsgrad>
__device__ __forceinline__ void adam_element(float& p, float& g, float& m, float& v, float& vmax, const AdamCoeffs& c) {
  if (c.unscale) g = g / c.grad_scale;
  float grad = c.maximize ? -g : g;
  if constexpr (kDecay == adam::Decay::kL2) grad = fmaf(p, c.weight_decay, grad);
  if constexpr (kDecay == adam::Decay::kDecoupled) p = p * c.decay_factor;
  // torch's lerp: start + w * (end - start) for |w| < 0.5, else end - (1 - w) * (end - start).
  m = fmaf(c.lerp_coeff, grad - m, c.lerp_from_start ? m : grad);
  // One rounding of v * beta2 + (1 - beta2) * grad^2, spelled out: left to the compiler, which product
  // goes into the fma depends on how the code around it happens to be inlined.
  v = fmaf(v, c.beta2, c.one_minus_beta2 * grad * grad);
  float second = v;
  if constexpr (kAmsgrad) {
    vmax = (v != v || v > vmax) ? v : vmax;  // NaN propagates, as torch.maximum
    second = vmax;
  }
  const float denom = sqrtf(second) / c.bias_correction2 + c.eps;
  p = p + c.neg_step_size * (m / denom);
}

template <typename T, adam::Decay kDecay, bool kAmsgrad>
struct AdamFunctor {
  // param, exp_avg, exp_avg_sq[, max_exp_avg_sq], grad: the grad last, as its store is conditional
  static constexpr int kLists = kAmsgrad ? 5 : 4;
  static constexpr int kGrad = kLists - 1;
  using PerTensor = const float*;  // the tensor's step
  using Args = AdamArgs;

  __device__ __forceinline__ void operator()(const mta::Chunk<kLists, PerTensor>& chunk, const AdamArgs& args) const {
    if (args.found_inf != nullptr && *args.found_inf != 0.0f) return;
    const double lr = args.lr_ptr != nullptr ? static_cast<double>(*args.lr_ptr) : args.lr;
    const double t = static_cast<double>(*chunk.per_tensor) + 1.0;
    AdamCoeffs c;
    c.unscale = args.grad_scale != nullptr;
    c.grad_scale = c.unscale ? *args.grad_scale : 1.0f;
    c.maximize = args.maximize;
    c.weight_decay = static_cast<float>(args.weight_decay);
    c.decay_factor = static_cast<float>(1.0 - lr * args.weight_decay);
    const float w = static_cast<float>(1.0 - args.beta1);
    c.lerp_from_start = fabsf(w) < 0.5f;
    c.lerp_coeff = c.lerp_from_start ? w : w - 1.0f;
    c.beta2 = static_cast<float>(args.beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - args.beta2);
    c.bias_correction2 = static_cast<float>(sqrt(1.0 - pow(args.beta2, t)));
    c.eps = static_cast<float>(args.eps);
    c.neg_step_size = static_cast<float>(-lr / (1.0 - pow(args.beta1, t)));

    bool store[kLists];
#pragma unroll
    for (int l = 0; l < kLists; ++l) store[l] = true;
    store[kGrad] = c.unscale;  // the grad is written back only when it was unscaled
    mta::for_each_element<T>(chunk, store, [&](float (&x)[kLists]) {
      if constexpr (kAmsgrad) {
        adam_element<kDecay, kAmsgrad>(x[0], x[kGrad], x[1], x[2], x[3], c);
      } else {
        float unused = 0.0f;
        adam_element<kDecay, kAmsgrad>(x[0], x[kGrad], x[1], x[2], unused, c);
      }
    });
  }
};

}  // namespace fastops::cuda
