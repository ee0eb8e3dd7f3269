// batch_norm, the op: its schemas and its Autograd kernel. The device kernels are in
// cpu/batch_norm.cpp and cuda/batch_norm.cu; the fake kernels and the backward op's autograd (for
// double backward) in fastops/ops/batch_norm.py.
//
// The Autograd kernel is C++ (a torch::autograd::Function) so that no Python runs on the way of a
// call: registered from Python every call entered a Python kernel at the Autograd key (a 0-element
// gelu cost 9.2 us against eager's 1.4, forward + backward 56 us against 20; torch 2.13). A call with
// no gradient to record goes straight below autograd; one that records runs the Function, whose
// backward calls the backward op below autograd too, or through autograd with create_graph (double
// backward: the backward op's own autograd).
#include <ATen/core/grad_mode.h>
#include <fastops/autograd.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

TORCH_LIBRARY_FRAGMENT(fastops, m) {
  // batch_norm: y = (x - mean) * invstd * weight + bias over dim 1, the statistics of the batch
  // (training) or the running ones (eval); fastops/ops/batch_norm.py. Returns (y, mean, invstd,
  // unbiased_var): mean and invstd in the compute dtype for the backward; unbiased_var (training only,
  // else empty) for the running-statistics update the caller makes. The backward returns (grad_x or
  // an empty tensor unless input_grad, grad_weight, grad_bias); grad_weight and grad_bias in the
  // compute dtype.
  m.def(
      "batch_norm(Tensor x, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, "
      "float eps) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "batch_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor mean, Tensor invstd, bool training, "
      "bool input_grad) -> (Tensor, Tensor, Tensor)");
}

namespace fastops {
namespace {

using BatchNormSig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, bool, double);
using BatchNormBackwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                            const std::optional<at::Tensor>&,
                                                                            const at::Tensor&, const at::Tensor&, bool,
                                                                            bool);

// The ops this file calls through the dispatcher (so that each device's kernel runs), looked up once.
struct Ops {
  c10::TypedOperatorHandle<BatchNormSig> batch_norm = find_op<BatchNormSig>("fastops::batch_norm");
  c10::TypedOperatorHandle<BatchNormBackwardSig> batch_norm_backward =
      find_op<BatchNormBackwardSig>("fastops::batch_norm_backward");
};

class BatchNormFunction : public torch::autograd::Function<BatchNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                               const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                               const std::optional<at::Tensor>& running_var, bool training, double eps) {
    auto [y, mean, invstd, unbiased_var] =
        below_autograd(handles<Ops>().batch_norm, x, weight, bias, running_mean, running_var, training, eps);
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
    auto [grad_x, grad_w, grad_b] = backward_call(handles<Ops>().batch_norm_backward, grads[0], x, weight, saved[2],
                                                  saved[3], ctx->saved_data["training"].toBool(), input_grad);
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
    return below_autograd(handles<Ops>().batch_norm, x, weight, bias, running_mean, running_var, training, eps);
  }
  const variable_list out = BatchNormFunction::apply(x, weight, bias, running_mean, running_var, training, eps);
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace
}  // namespace fastops

TORCH_LIBRARY_IMPL(fastops, Autograd, m) { m.impl("batch_norm", &fastops::batch_norm_autograd); }
