// fused_adam_ on the CPU: one Adam / AdamW step over whole lists of tensors, in one pass.
//
// Per element, with t = step + 1, and g unscaled by grad_scale (and written back unscaled) when given:
//   g  = maximize ? -g : g;          g += wd * p  (Adam, L2)   |   p *= 1 - lr * wd  (AdamW, decoupled)
//   m  = lerp(m, g, 1 - beta1)       v = v * beta2 + (1 - beta2) * g * g       vmax = max(vmax, v) (amsgrad)
//   p += -(lr / (1 - beta1^t)) * m / (sqrt(v or vmax) / sqrt(1 - beta2^t) + eps)
// with the operations in the order torch.optim.Adam(foreach=False) performs them, so fp32 results
// agree to rounding. Then step += 1. When found_inf != 0 nothing is touched, steps included. A param
// listed k times is updated once per occurrence, each time with t = step + k (torch's fused Adam
// counts every listed step first), its occurrences in successive parallel regions (rounds).
//
// Strategy (include/fastops/multi_tensor.h): the tensors of one dtype are laid end to end as one flat
// index space and at::parallel_for splits that space evenly over the threads, so a huge tensor is
// split and tiny ones are batched into one task, and empty tensors take no work wherever they are.
// Each piece runs at::vec over Vectorized<float> (fp16/bf16 widened to fp32, fp64 in double);
// only the state is rounded to the param dtype on store. Per-tensor scalars (bias corrections from
// that tensor's own step) are computed once in double.
// Bytes per element: reads p, g, m, v and writes p, m, v = 7 * sizeof(T) (28 B for fp32); amsgrad
// adds 2 * sizeof(T), grad_scale adds sizeof(T) (the unscaled grad written back).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <fastops/adam.h>
#include <fastops/checks.h>
#include <fastops/cpu_loops.h>
#include <fastops/multi_tensor.h>
#include <torch/library.h>

#include <algorithm>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

using adam::Decay;

// The per-element update on one vector of opmath values; every member is a broadcast scalar. The
// flags that vary per call become data (a sign mask, a blend mask) rather than branches, and unscaling
// (a division, rare) a template argument, so the loop body is straight-line code.
template <typename M, Decay kDecay, bool kAmsgrad>
struct AdamMath {
  using V = at::vec::Vectorized<M>;
  static constexpr bool amsgrad = kAmsgrad;
  V grad_scale, weight_decay, decay_factor, lerp_coeff, beta2, one_minus_beta2, bias_correction2, eps, neg_step_size;
  V maximize_sign;       // -0.0 with maximize, else +0.0: xor flips the sign exactly as torch's -grad does
  V lerp_base_is_start;  // all bits set where lerp starts from m (|w| < 0.5), else 0

  // The update in two halves, so the caller can store m and v (and vmax, and the unscaled g) before
  // the square root and the two divisions. g is updated in place to the unscaled gradient (what is
  // written back when kUnscale).
  template <bool kUnscale>
  inline void moments(V& p, V& g, V& m, V& v, V& vmax) const {
    if constexpr (kUnscale) g = g / grad_scale;
    V grad = g ^ maximize_sign;
    if constexpr (kDecay == Decay::kL2) grad = at::vec::fmadd(p, weight_decay, grad);
    if constexpr (kDecay == Decay::kDecoupled) p = p * decay_factor;
    // torch's lerp: start + w * (end - start) for |w| < 0.5, else end - (1 - w) * (end - start).
    m = at::vec::fmadd(lerp_coeff, grad - m, V::blendv(grad, m, lerp_base_is_start));
    v = v * beta2;
    v = v + one_minus_beta2 * grad * grad;
    if constexpr (kAmsgrad) vmax = at::vec::maximum(vmax, v);
  }
  inline void param(V& p, const V& m, const V& v, const V& vmax) const {
    const V second = kAmsgrad ? vmax : v;
    const V denom = second.sqrt() / bias_correction2 + eps;
    p = p + neg_step_size * (m / denom);
  }
};

template <typename T>
struct Pointers {
  T* p;
  T* g;
  T* m;
  T* v;
  T* vmax;  // nullptr without amsgrad
};

// Runs math over elements [begin, end) of one tensor: full vectors, then one partial vector. The
// pointers and math are copied to locals first: a vector store may alias any memory (the intrinsic
// types are may_alias), so anything read through a reference would be reloaded after every store.
// narrow(lo, hi): fp32 halves to one Vectorized<T> for fp16/bf16 (with_narrowing's choice).
template <typename T, bool kUnscale, typename Math, typename Narrow>
void update_range(const Pointers<T>& ptr, int64_t begin, int64_t end, const Math& math_ref, const Narrow& narrow) {
  using MV = at::vec::Vectorized<opmath_t<T>>;
  using TV = at::vec::Vectorized<T>;
  constexpr int64_t width = TV::size();
  const Math math = math_ref;
  T* const p = ptr.p + begin;
  T* const g = ptr.g + begin;
  T* const m = ptr.m + begin;
  T* const v = ptr.v + begin;
  T* const vmax = ptr.vmax == nullptr ? nullptr : ptr.vmax + begin;
  constexpr bool ams = Math::amsgrad;
  // One vector at offset i; count < width only for the last one (full is a compile-time bool).
  auto update = [&](auto full, int64_t i, int64_t count) {
    constexpr bool is_full = decltype(full)::value;
    auto load = [&](const T* src) {
      if constexpr (is_full) {
        return TV::loadu(src + i);
      } else {
        return TV::loadu(src + i, count);
      }
    };
    auto store = [&](const TV& value, T* dst) {
      if constexpr (is_full) {
        value.store(dst + i);
      } else {
        value.store(dst + i, count);
      }
    };
    const TV pt = load(p), gt = load(g), mt = load(m), vt = load(v);
    TV xt(T(0));
    if constexpr (ams) xt = load(vmax);
    // m and v are stored as soon as they are known, p after the divisions (torch's order). A load of
    // a later vector that matches one of these stores in its low 12 address bits (4K aliasing: the
    // streams' offsets mod 4 KiB decide which) waits for that store's data; from m and v that is a
    // few FMAs, from p the whole sqrt/div chain. With every store after the divisions, layouts with
    // streams 64 B apart ran 6-12% behind torch's kernel on AVX-512. Storing early also frees m and
    // v's registers before the divisions: AVX2 bf16 (16 ymm registers, two fp32 halves) ran 12%
    // behind torch on every layout tried, and now runs ahead
    // (git show 00da02d:benchmarks/results/fused_adam_cpu_issue16_b.md).
    if constexpr (is_reduced_float_v<T>) {
      auto [p0, p1] = at::vec::convert_to_float<T>(pt);
      auto [g0, g1] = at::vec::convert_to_float<T>(gt);
      auto [m0, m1] = at::vec::convert_to_float<T>(mt);
      auto [v0, v1] = at::vec::convert_to_float<T>(vt);
      auto [x0, x1] = at::vec::convert_to_float<T>(xt);
      math.template moments<kUnscale>(p0, g0, m0, v0, x0);
      math.template moments<kUnscale>(p1, g1, m1, v1, x1);
      store(narrow(m0, m1), m);
      store(narrow(v0, v1), v);
      if constexpr (ams) store(narrow(x0, x1), vmax);
      if constexpr (kUnscale) store(narrow(g0, g1), g);
      math.param(p0, m0, v0, x0);
      math.param(p1, m1, v1, x1);
      store(narrow(p0, p1), p);
    } else {
      MV pm = pt, gm = gt, mm = mt, vm = vt, xm = xt;
      math.template moments<kUnscale>(pm, gm, mm, vm, xm);
      auto store_state = [&] {
        store(mm, m);
        store(vm, v);
        if constexpr (ams) store(xm, vmax);
        if constexpr (kUnscale) store(gm, g);
      };
      // With 8-lane vectors (AVX2 fp32) storing early measured no better (0.99x against 1.02x
      // over six processes, within the noise): the order there stays as it was.
      constexpr bool kEarly = TV::size() >= 16;
      if constexpr (kEarly) store_state();
      math.param(pm, mm, vm, xm);
      store(pm, p);
      if constexpr (!kEarly) store_state();
    }
  };
  const int64_t n = end - begin;
  int64_t i = 0;
  for (; i + width <= n; i += width) update(std::true_type{}, i, width);
  if (i < n) update(std::false_type{}, i, n - i);
}

// Elements per task of at::parallel_for: big enough to amortise a task, small enough that a
// 100 MB tensor splits over every core.
constexpr int64_t kGrain = 1 << 15;

template <typename T, Decay kDecay, bool kAmsgrad>
void run_dtype_group(const adam::Work& w, const std::vector<size_t>& idx, const adam::Hyper& h,
                     const std::vector<adam::StepScalars>& scalars, double grad_scale, bool unscale) {
  using M = opmath_t<T>;
  using V = at::vec::Vectorized<M>;
  const size_t n = idx.size();
  std::vector<Pointers<T>> ptrs(n);
  std::vector<int64_t> offsets(n + 1, 0);  // offsets[k]: first flat index of tensor k
  for (size_t k = 0; k < n; ++k) {
    const size_t i = idx[k];
    ptrs[k] = {w.params[i].data_ptr<T>(), w.grads[i].data_ptr<T>(), w.exp_avgs[i].data_ptr<T>(),
               w.exp_avg_sqs[i].data_ptr<T>(), kAmsgrad ? w.max_exp_avg_sqs[i].data_ptr<T>() : nullptr};
    offsets[k + 1] = offsets[k] + w.params[i].numel();
  }

  const double lerp_weight = 1.0 - h.beta1;
  AdamMath<M, kDecay, kAmsgrad> base{};
  base.grad_scale = V(static_cast<M>(grad_scale));
  base.weight_decay = V(static_cast<M>(h.weight_decay));
  base.decay_factor = V(static_cast<M>(1.0 - h.lr * h.weight_decay));
  // The weight is rounded to opmath first, then the branch and coefficient follow from it, as in torch.
  const M w_m = static_cast<M>(lerp_weight);
  const bool lerp_from_start = std::abs(w_m) < M(0.5);
  base.lerp_coeff = V(lerp_from_start ? w_m : w_m - M(1));
  base.lerp_base_is_start = lerp_from_start ? V(M(0)) == V(M(0)) : V(M(0));  // == sets every bit
  base.beta2 = V(static_cast<M>(h.beta2));
  base.one_minus_beta2 = V(static_cast<M>(1.0 - h.beta2));
  base.eps = V(static_cast<M>(h.eps));
  base.maximize_sign = V(h.maximize ? M(-0.0) : M(0.0));

  with_narrowing<T>([&](const auto narrow) {
    multi_tensor::parallel_over_tensors(offsets, kGrain, [&](size_t k, int64_t begin, int64_t end) {
      AdamMath<M, kDecay, kAmsgrad> math = base;
      math.bias_correction2 = V(static_cast<M>(scalars[idx[k]].bias_correction2));
      math.neg_step_size = V(static_cast<M>(-scalars[idx[k]].step_size));
      if (unscale) {
        update_range<T, true>(ptrs[k], begin, end, math, narrow);
      } else {
        update_range<T, false>(ptrs[k], begin, end, math, narrow);
      }
    });
  });
}

template <typename T>
void run_dtype(const adam::Work& w, const std::vector<size_t>& idx, const adam::Hyper& h,
               const std::vector<adam::StepScalars>& scalars, double grad_scale, bool unscale) {
  adam::dispatch_variant(h, [&](auto decay, auto amsgrad) {
    run_dtype_group<T, decltype(decay)::value, decltype(amsgrad)::value>(w, idx, h, scalars, grad_scale, unscale);
  });
}

}  // namespace

void fused_adam_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList max_exp_avg_sqs, at::TensorList steps, const std::optional<at::Tensor>& lr_tensor,
                 double lr, double beta1, double beta2, double weight_decay, double eps, bool amsgrad, bool maximize,
                 bool decoupled_weight_decay, const std::optional<at::Tensor>& grad_scale,
                 const std::optional<at::Tensor>& found_inf) {
  adam::Hyper h{lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, decoupled_weight_decay};
  if (lr_tensor.has_value()) h.lr = adam::host_scalar("lr", *lr_tensor);
  adam::check_hyper(h);
  const bool unscale = grad_scale.has_value();
  adam::Work w = adam::prepare(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, amsgrad, unscale);
  // On the CPU reading the flags is free: a skipped step costs nothing and touches nothing.
  if (found_inf.has_value() && adam::host_scalar("found_inf", *found_inf) != 0.0) return;
  const double scale = unscale ? adam::host_scalar("grad_scale", *grad_scale) : 1.0;

  // A param listed k times is updated k times, in list order, each time with t = step + k, and its
  // step ends k higher: torch's fused Adam adds 1 to every listed step before its kernel runs. So the
  // steps of later occurrences are counted first, and every first occurrence's after the update.
  for (size_t i = 0; i < w.steps.size(); ++i) {
    if (w.repeats.round[i] > 0) *w.steps[i].data_ptr<float>() += 1.0f;
  }
  std::vector<adam::StepScalars> scalars(w.params.size());
  for (size_t i = 0; i < w.params.size(); ++i) {
    const double t = static_cast<double>(*w.steps[i].data_ptr<float>()) + 1.0;
    scalars[i] = adam::step_scalars(h.lr, h.beta1, h.beta2, t);
  }
  // One parallel region per (round, dtype), rounds in order. No structured binding: capturing one in a
  // lambda is C++20, and builds against an older torch are C++17.
  for (const auto& entry : adam::groups(w)) {
    const std::vector<size_t>& idx = entry.second;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, entry.first.second, "fastops_fused_adam_cpu",
                                    [&] { run_dtype<scalar_t>(w, idx, h, scalars, scale, unscale); });
  }
  for (size_t i = 0; i < w.steps.size(); ++i) {
    if (w.repeats.round[i] == 0) *w.steps[i].data_ptr<float>() += 1.0f;
  }
  w.finish();
}

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
