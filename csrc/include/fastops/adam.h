// Host-side pieces of fused_adam_ shared by the CPU and CUDA kernels: hyper-parameter checks, the
// per-tensor checks of the six tensor lists, and the layout fallback for tensors that are not all
// laid out the same way.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <fastops/checks.h>
#include <fastops/multi_tensor.h>

#include <cmath>
#include <map>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace fastops::adam {

struct Hyper {
  double lr;
  double beta1;
  double beta2;
  double weight_decay;
  double eps;
  bool amsgrad;
  bool maximize;
  bool decoupled_weight_decay;
};

// The same bounds torch.optim.Adam enforces, also at step time (a scheduler or a loaded
// checkpoint can change a group after construction). h.lr is the float lr or the value of an lr
// tensor in host memory; an lr tensor on the device is not read here (that would be a host sync).
inline void check_hyper(const Hyper& h) {
  FASTOPS_CHECK_ARG(h.lr >= 0.0, "fastops.fused_adam_: expected lr >= 0, got ", str(h.lr));
  FASTOPS_CHECK_ARG(h.beta1 >= 0.0 && h.beta1 < 1.0, "fastops.fused_adam_: expected beta1 in [0, 1), got ",
                    str(h.beta1));
  FASTOPS_CHECK_ARG(h.beta2 >= 0.0 && h.beta2 < 1.0, "fastops.fused_adam_: expected beta2 in [0, 1), got ",
                    str(h.beta2));
  FASTOPS_CHECK_ARG(h.eps >= 0.0, "fastops.fused_adam_: expected eps >= 0, got ", str(h.eps));
  FASTOPS_CHECK_ARG(h.weight_decay >= 0.0, "fastops.fused_adam_: expected weight_decay >= 0, got ",
                    str(h.weight_decay));
}

// The value of a 1-element floating tensor in host memory (a CPU lr, grad_scale or found_inf): a plain
// load, no device sync.
inline double host_scalar(const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.numel() == 1 && t.device().is_cpu() && at::isFloatingType(t.scalar_type()),
              "fastops.fused_adam_: expected ", arg, " to be a 1-element floating tensor on the CPU, got ",
              str(t.scalar_type()), " with ", str(t.numel()), " elements on ", str(t.device()));
  return t.item<double>();
}

// Two dense tensors whose elements sit in the same order in memory: equal strides on every dimension
// of size > 1 (strides of size-1 dimensions never matter, and autograd does not always agree on them).
inline bool same_dense_layout(const at::Tensor& a, const at::Tensor& b) {
  if (!a.is_non_overlapping_and_dense() || !b.is_non_overlapping_and_dense()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

// The lists the kernels walk: every tensor of index i has the memory order of work.params[i], so
// the kernels index all five flat. Tensors that had another layout are replaced by copies, written
// back by finish(). A param listed again shares the working tensors of its first occurrence.
struct Work {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (caller's tensor, working copy)
  multi_tensor::Repeats repeats;                             // of params: the rounds of the update

  void finish() {
    for (auto& [original, working] : copy_back) original.copy_(working);
    copy_back.clear();
  }
};

inline void check_list_size(const char* arg, size_t got, size_t want) {
  TORCH_CHECK(got == want, "fastops.fused_adam_: expected ", arg, " to hold one tensor per param (",
              str(static_cast<int64_t>(want)), "), got ", str(static_cast<int64_t>(got)));
}

// Checks the lists and builds the working set. All tensors must be on `device`; steps are 1-element
// float32 tensors on that device (the optimizer keeps them there, as torch's fused Adam does). A
// param listed again (the optimizer does so for a param listed twice in a group) must come with the
// same grad, state and step; different params must not share memory, nor a step.
inline Work prepare(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                    at::TensorList max_exp_avg_sqs, at::TensorList steps, bool amsgrad, bool writes_grads) {
  const size_t n = params.size();
  check_list_size("grads", grads.size(), n);
  check_list_size("exp_avgs", exp_avgs.size(), n);
  check_list_size("exp_avg_sqs", exp_avg_sqs.size(), n);
  check_list_size("steps", steps.size(), n);
  if (amsgrad) {
    check_list_size("max_exp_avg_sqs", max_exp_avg_sqs.size(), n);
  } else {
    TORCH_CHECK(max_exp_avg_sqs.empty(), "fastops.fused_adam_: max_exp_avg_sqs must be empty when amsgrad is False");
  }
  Work w;
  w.params.reserve(n);
  w.grads.reserve(n);
  w.exp_avgs.reserve(n);
  w.exp_avg_sqs.reserve(n);
  w.steps.reserve(n);
  if (amsgrad) w.max_exp_avg_sqs.reserve(n);
  if (n == 0) return w;
  const at::Device device = params[0].device();
  w.repeats = multi_tensor::find_repeats(params);
  for (size_t i = 0; i < n; ++i) {
    const size_t f = w.repeats.first[i];
    if (f != i) {
      const bool same_state = grads[i].is_same(grads[f]) && exp_avgs[i].is_same(exp_avgs[f]) &&
                              exp_avg_sqs[i].is_same(exp_avg_sqs[f]) && steps[i].is_same(steps[f]) &&
                              (!amsgrad || max_exp_avg_sqs[i].is_same(max_exp_avg_sqs[f]));
      TORCH_CHECK(same_state, "fastops.fused_adam_: params[", str(static_cast<int64_t>(i)), "] is params[",
                  str(static_cast<int64_t>(f)),
                  "] again but comes with other tensors; a param listed twice must come with the same grad, "
                  "exp_avg, exp_avg_sq, max_exp_avg_sq and step");
      w.params.push_back(w.params[f]);
      w.grads.push_back(w.grads[f]);
      w.exp_avgs.push_back(w.exp_avgs[f]);
      w.exp_avg_sqs.push_back(w.exp_avg_sqs[f]);
      if (amsgrad) w.max_exp_avg_sqs.push_back(w.max_exp_avg_sqs[f]);
      w.steps.push_back(w.steps[f]);
      continue;
    }
    const at::Tensor& p = params[i];
    TORCH_CHECK(p.layout() == at::kStrided, "fastops.fused_adam_: sparse params are not supported");
    TORCH_CHECK(!p.is_complex(), "fastops.fused_adam_: complex params are not supported (view them as real)");
    check_floating("fused_adam_", "params", p);
    check_same_device("fused_adam_", "params", p, "params[0]", params[0]);
    TORCH_CHECK(grads[i].layout() == at::kStrided,
                "fastops.fused_adam_: sparse gradients are not supported (use torch.optim.SparseAdam)");
    const std::pair<const char*, const at::Tensor*> state[] = {
        {"grads", &grads[i]},
        {"exp_avgs", &exp_avgs[i]},
        {"exp_avg_sqs", &exp_avg_sqs[i]},
        {"max_exp_avg_sqs", amsgrad ? &max_exp_avg_sqs[i] : nullptr},
    };
    for (const auto& [arg, t] : state) {
      if (t == nullptr) continue;
      check_same_device("fused_adam_", arg, *t, "params", p);
      check_same_dtype("fused_adam_", arg, *t, "params", p);
      check_same_shape("fused_adam_", arg, *t, "params", p);
    }
    const at::Tensor& s = steps[i];
    TORCH_CHECK(s.numel() == 1 && s.scalar_type() == at::kFloat && s.device() == device,
                "fastops.fused_adam_: expected each step to be a 1-element float32 tensor on ", str(device), ", got ",
                str(s.scalar_type()), " with ", str(s.numel()), " elements on ", str(s.device()));

    at::Tensor wp = p.is_non_overlapping_and_dense() ? p : p.contiguous();
    if (!wp.is_same(p)) w.copy_back.emplace_back(p, wp);
    auto working = [&](const at::Tensor& t, bool mutated) {
      if (same_dense_layout(t, wp)) return t;
      at::Tensor copy = at::empty_like(wp).copy_(t);
      if (mutated) w.copy_back.emplace_back(t, copy);
      return copy;
    };
    w.params.push_back(wp);
    w.grads.push_back(working(grads[i], writes_grads));
    w.exp_avgs.push_back(working(exp_avgs[i], true));
    w.exp_avg_sqs.push_back(working(exp_avg_sqs[i], true));
    if (amsgrad) w.max_exp_avg_sqs.push_back(working(max_exp_avg_sqs[i], true));
    w.steps.push_back(s);
  }
  multi_tensor::check_disjoint("fused_adam_", "params", w.params, w.repeats.first);
  multi_tensor::check_disjoint("fused_adam_", "steps", w.steps, w.repeats.first);
  return w;
}

// Rows of the update grouped by (round, dtype), in round order: one parallel region (CPU) or one
// multi-tensor apply (CUDA) per group, so that no group holds a tensor twice.
inline std::map<std::pair<int, at::ScalarType>, std::vector<size_t>> groups(const Work& w) {
  std::map<std::pair<int, at::ScalarType>, std::vector<size_t>> out;
  for (size_t i = 0; i < w.params.size(); ++i) out[{w.repeats.round[i], w.params[i].scalar_type()}].push_back(i);
  return out;
}

// The steps of the rows in round r.
inline std::vector<at::Tensor> steps_of_round(const Work& w, int r) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < w.steps.size(); ++i) {
    if (w.repeats.round[i] == r) out.push_back(w.steps[i]);
  }
  return out;
}

// How weight decay enters: not at all, added to the gradient (Adam), or decoupled (AdamW).
enum class Decay { kNone, kL2, kDecoupled };

// Calls f(std::integral_constant<Decay, ...>, std::bool_constant<amsgrad>) for h's variant, so the
// kernels are compiled once per variant with no per-element branch on it.
template <typename F>
void dispatch_variant(const Hyper& h, const F& f) {
  auto with_decay = [&](auto decay) {
    if (h.amsgrad) {
      f(decay, std::true_type{});
    } else {
      f(decay, std::false_type{});
    }
  };
  if (h.weight_decay == 0.0) {
    with_decay(std::integral_constant<Decay, Decay::kNone>{});
  } else if (h.decoupled_weight_decay) {
    with_decay(std::integral_constant<Decay, Decay::kDecoupled>{});
  } else {
    with_decay(std::integral_constant<Decay, Decay::kL2>{});
  }
}

// Bias corrections of step t (1-based), in double as torch's single-tensor Adam computes them.
struct StepScalars {
  double step_size;         // lr / (1 - beta1^t)
  double bias_correction2;  // sqrt(1 - beta2^t)
};

inline StepScalars step_scalars(double lr, double beta1, double beta2, double t) {
  return {lr / (1.0 - std::pow(beta1, t)), std::sqrt(1.0 - std::pow(beta2, t))};
}

}  // namespace fastops::adam
