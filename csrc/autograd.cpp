// The Autograd kernels of gelu, bias_gelu, clipped_log, depthwise_conv2d and batch_norm, in C++.
//
// Why: registered from Python (torch.library.register_autograd) every call of these ops entered a
// Python kernel at the Autograd key, with grad or without: with a 0-element tensor on the CPU,
// fastops.gelu cost 9.2 us against eager's 1.4, a forward that records the graph 19.7 against 1.7,
// and forward + backward 56 against 20 (2026-11-27, torch 2.13). On a GPU that overhead is the whole
// gap below ~16M elements (git show 00da02d:benchmarks/results/gpu_h200_2026-11-27.md). Here a call with no gradient
// to record goes straight below autograd, and one that records runs a torch::autograd::Function whose
// backward calls the backward op below autograd too (one dispatcher hop, no Python).
//
// Double backward: with create_graph the backward op is called through autograd instead, where its
// own registration (Python, fastops/ops/*.py: gelu'', the clamp's and batch norm's second derivatives) records the
// graph (depthwise's backward ops have none). Each op's fake kernel stays in Python, and
// its autocast rule where it was (Python, or csrc/autocast.cpp for depthwise).
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fastops/checks.h>
#include <fastops/op_handle.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace fastops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using GeluSig = at::Tensor(const at::Tensor&, c10::string_view);
using GeluBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);
using BiasGeluSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);
using BiasGeluBackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                               c10::string_view);
using ClippedLogSig = at::Tensor(const at::Tensor&, double, bool);
using ClippedLogBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, double, bool);
using DepthwiseSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
                                at::IntArrayRef, at::IntArrayRef);
using DepthwiseBackwardInputSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, at::IntArrayRef,
                                             at::IntArrayRef, at::IntArrayRef, bool);
using DepthwiseBackwardWeightSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                      at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                                                                      at::IntArrayRef);
using BatchNormSig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, bool, double);
using BatchNormBackwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                            const std::optional<at::Tensor>&,
                                                                            const at::Tensor&, const at::Tensor&, bool,
                                                                            bool);

const auto& gelu_op() {
  static const auto op = find_op<GeluSig>("fastops::gelu");
  return op;
}
const auto& gelu_backward_op() {
  static const auto op = find_op<GeluBackwardSig>("fastops::gelu_backward");
  return op;
}
const auto& bias_gelu_op() {
  static const auto op = find_op<BiasGeluSig>("fastops::bias_gelu");
  return op;
}
const auto& bias_gelu_backward_op() {
  static const auto op = find_op<BiasGeluBackwardSig>("fastops::bias_gelu_backward");
  return op;
}
const auto& clipped_log_op() {
  static const auto op = find_op<ClippedLogSig>("fastops::clipped_log");
  return op;
}
const auto& clipped_log_backward_op() {
  static const auto op = find_op<ClippedLogBackwardSig>("fastops::clipped_log_backward");
  return op;
}

const auto& depthwise_op() {
  static const auto op = find_op<DepthwiseSig>("fastops::depthwise_conv2d");
  return op;
}
const auto& depthwise_backward_input_op() {
  static const auto op = find_op<DepthwiseBackwardInputSig>("fastops::depthwise_conv2d_backward_input");
  return op;
}
const auto& depthwise_backward_weight_op() {
  static const auto op = find_op<DepthwiseBackwardWeightSig>("fastops::depthwise_conv2d_backward_weight");
  return op;
}
const auto& batch_norm_op() {
  static const auto op = find_op<BatchNormSig>("fastops::batch_norm");
  return op;
}
const auto& batch_norm_backward_op() {
  static const auto op = find_op<BatchNormBackwardSig>("fastops::batch_norm_backward");
  return op;
}

// Calls op below the autograd keys (the device kernel; autocast has already run).
template <typename Op, typename... Args>
auto below_autograd(const Op& op, Args&&... args) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(std::forward<Args>(args)...);
}

// A backward op from a backward: through autograd when the graph of the backward is being recorded
// (create_graph), else straight to the kernel.
template <typename Op, typename... Args>
auto backward_call(const Op& op, Args&&... args) {
  if (at::GradMode::is_enabled()) return op.call(std::forward<Args>(args)...);
  return below_autograd(op, std::forward<Args>(args)...);
}

bool records_grad(std::initializer_list<const at::Tensor*> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

// ---- gelu ----------------------------------------------------------------------------------------

class GeluFunction : public torch::autograd::Function<GeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::string& approximate) {
    ctx->save_for_backward({x});  // the output is not needed: the backward kernel recomputes from x
    ctx->saved_data["approximate"] = approximate;
    return below_autograd(gelu_op(), x, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    return {backward_call(gelu_backward_op(), grads[0], x, approximate), at::Tensor()};
  }
};

at::Tensor gelu_autograd(const at::Tensor& x, c10::string_view approximate) {
  if (!records_grad({&x})) return below_autograd(gelu_op(), x, approximate);
  return GeluFunction::apply(x, std::string(approximate));
}

// ---- bias_gelu -----------------------------------------------------------------------------------

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias,
                            const std::string& approximate) {
    ctx->save_for_backward({x, bias});  // x + bias is recomputed in the backward kernel, never stored
    ctx->saved_data["approximate"] = approximate;
    return below_autograd(bias_gelu_op(), x, bias, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    auto [grad_x, grad_bias] = backward_call(bias_gelu_backward_op(), grads[0], saved[0], saved[1], approximate);
    return {grad_x, grad_bias, at::Tensor()};
  }
};

at::Tensor bias_gelu_autograd(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  if (!records_grad({&x, &bias})) return below_autograd(bias_gelu_op(), x, bias, approximate);
  return BiasGeluFunction::apply(x, bias, std::string(approximate));
}

// ---- clipped_log ---------------------------------------------------------------------------------

class ClippedLogFunction : public torch::autograd::Function<ClippedLogFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double eps, bool straight_through) {
    ctx->save_for_backward({x});  // the only saved tensor: the output is not needed
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["straight_through"] = straight_through;
    return below_autograd(clipped_log_op(), x, eps, straight_through);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const double eps = ctx->saved_data["eps"].toDouble();
    const bool straight_through = ctx->saved_data["straight_through"].toBool();
    return {backward_call(clipped_log_backward_op(), grads[0], x, eps, straight_through), at::Tensor(), at::Tensor()};
  }
};

at::Tensor clipped_log_autograd(const at::Tensor& x, double eps, bool straight_through) {
  if (!records_grad({&x})) return below_autograd(clipped_log_op(), x, eps, straight_through);
  return ClippedLogFunction::apply(x, eps, straight_through);
}

// ---- depthwise_conv2d ----------------------------------------------------------------------------

class DepthwiseFunction : public torch::autograd::Function<DepthwiseFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, std::vector<int64_t> stride,
                            std::vector<int64_t> padding, std::vector<int64_t> dilation) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["has_bias"] = bias.has_value() && bias->defined();
    ctx->saved_data["channels_last"] = use_channels_last(x);
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    return below_autograd(depthwise_op(), x, weight, bias, stride, padding, dilation);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const std::vector<int64_t> stride = ctx->saved_data["stride"].toIntVector();
    const std::vector<int64_t> padding = ctx->saved_data["padding"].toIntVector();
    const std::vector<int64_t> dilation = ctx->saved_data["dilation"].toIntVector();
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) {
      grad_x = backward_call(depthwise_backward_input_op(), grads[0], weight, x.sym_sizes(), stride, padding, dilation,
                             ctx->saved_data["channels_last"].toBool());
    }
    if (ctx->needs_input_grad(1) || (has_bias && ctx->needs_input_grad(2))) {
      std::tie(grad_w, grad_b) =
          backward_call(depthwise_backward_weight_op(), grads[0], x, at::IntArrayRef{weight.size(2), weight.size(3)},
                        stride, padding, dilation);
      if (!has_bias) grad_b = at::Tensor();
      // In the weight's own strides, as PyTorch's conv gives it (the gradient layout contract, which
      // DDP's buckets rely on): a channels_last [C, 1, kh, kw] weight differs from a contiguous one
      // in the stride of its size-1 dim only, and a few C * kh * kw elements are cheap to copy.
      if (grad_w.defined() && grad_w.sym_strides() != weight.sym_strides() && weight.is_non_overlapping_and_dense()) {
        grad_w = at::empty_like(weight, grad_w.options()).copy_(grad_w);
      }
    }
    return {grad_x, grad_w, grad_b, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor depthwise_autograd(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  if (!records_grad({&x, &weight, &b})) {
    return below_autograd(depthwise_op(), x, weight, bias, stride, padding, dilation);
  }
  return DepthwiseFunction::apply(x, weight, bias, stride.vec(), padding.vec(), dilation.vec());
}

// ---- batch_norm ----------------------------------------------------------------------------------

class BatchNormFunction : public torch::autograd::Function<BatchNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                               const std::optional<at::Tensor>& running_var, bool training, double eps) {
    auto [y, mean, invstd, unbiased_var] =
        below_autograd(batch_norm_op(), x, weight, bias, running_mean, running_var, training, eps);
    const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
    // y is not saved: the backward needs x - mean, which x and mean give without a division.
    ctx->save_for_backward({x, w, mean, invstd});
    ctx->saved_data["training"] = training;
    const bool has_bias = bias.has_value() && bias->defined();
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(has_bias ? bias->scalar_type() : mean.scalar_type());
    ctx->mark_non_differentiable({mean, invstd, unbiased_var});
    return {y, mean, invstd, unbiased_var};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1];
    variable_list out(7);                 // one per argument of forward
    if (!grads[0].defined()) return out;  // y did not reach the loss
    // needs_input_grad counts the defined tensor arguments only (an absent weight has no slot).
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    const bool input_grad = ctx->needs_input_grad(0);
    const bool weight_grad = w.defined() && ctx->needs_input_grad(1);
    const bool bias_grad = has_bias && ctx->needs_input_grad(w.defined() ? 2 : 1);
    const std::optional<at::Tensor> weight = w.defined() ? std::optional<at::Tensor>(w) : std::nullopt;
    auto [grad_x, grad_w, grad_b] = backward_call(batch_norm_backward_op(), grads[0], x, weight, saved[2], saved[3],
                                                  ctx->saved_data["training"].toBool(), input_grad);
    if (input_grad) out[0] = grad_x;
    // The per-channel gradients come in the compute dtype; a parameter keeps its own.
    if (weight_grad) out[1] = grad_w.to(w.scalar_type());
    if (bias_grad) out[2] = grad_b.to(static_cast<at::ScalarType>(ctx->saved_data["bias_dtype"].toInt()));
    return out;
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_autograd(
    const at::Tensor& x, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double eps) {
  const at::Tensor w = weight.has_value() ? *weight : at::Tensor();
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  if (!records_grad({&x, &w, &b})) {
    return below_autograd(batch_norm_op(), x, weight, bias, running_mean, running_var, training, eps);
  }
  const variable_list out = BatchNormFunction::apply(x, weight, bias, running_mean, running_var, training, eps);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace
}  // namespace fastops

TORCH_LIBRARY_IMPL(fastops, Autograd, m) {
  m.impl("batch_norm", &fastops::batch_norm_autograd);
  m.impl("gelu", &fastops::gelu_autograd);
  m.impl("bias_gelu", &fastops::bias_gelu_autograd);
  m.impl("clipped_log", &fastops::clipped_log_autograd);
  m.impl("depthwise_conv2d", &fastops::depthwise_autograd);
}
