// batch_norm, the op: its schemas and its autograd, first and second derivative. The device kernels
// are in cpu/batch_norm.cpp and cuda/batch_norm.cu; the fake kernels in fastops/ops/batch_norm.py.
// No autocast rule: it runs in the dtype that arrives, as aten's batch_norm does.
//
// The Autograd kernels are C++ (torch::autograd::Function) so that no Python runs on the way of a
// call: registered from Python every call entered a Python kernel at the Autograd key (a 0-element
// gelu cost 9.2 us against eager's 1.4, forward + backward 56 us against 20; torch 2.13). A call with
// no gradient to record goes straight below autograd; one that records runs the Function, whose
// backward calls the backward op below autograd too, or through autograd with create_graph. Then
// the backward op's own Function (below) gives the double backward (gradient penalties,
// Hessian-vector products) as the vector-Jacobian product of the first derivative's formula written
// in differentiable ATen ops: second derivatives are rare enough that a kernel would not pay for
// itself, and a vjp of the first-derivative formula cannot drift from it.
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros_like.h>
#include <fastops/autograd.h>
#include <fastops/cpu_capability.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

// The CPU kernels (cpu/batch_norm.cpp), one per ISA level; the running level's are registered below.
FASTOPS_DECLARE_CPU_KERNEL(batch_norm,
                           std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                               const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, bool, double))
FASTOPS_DECLARE_CPU_KERNEL(batch_norm_backward,
                           std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                          const std::optional<at::Tensor>&,
                                                                          const at::Tensor&, const at::Tensor&, bool,
                                                                          bool))

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

// The vector-Jacobian product of fn at primals with cotangents (one per output of fn; undefined:
// zero), as torch.func.vjp takes it, for the primals `wanted` (undefined for the others). fn runs on
// fresh handles of the wanted primals, the others entering as constants, so that each gradient is the
// partial derivative along fn alone (a primal also reached through another, as x through grad_out in
// a gradient penalty, is not counted twice). With create_graph a handle is a view of its primal, so
// the result is differentiable again through the primals' graph, and requires grad only where it
// depends on something that does. A wanted primal that fn does not reach gets zeros, as from
// torch.func.vjp.
variable_list vjp(const std::function<variable_list(const variable_list&)>& fn, const variable_list& primals,
                  const variable_list& cotangents, const std::vector<bool>& wanted) {
  const bool create_graph = at::GradMode::is_enabled();
  at::AutoGradMode grad_mode(true);
  variable_list args = primals, inputs;
  for (size_t i = 0; i < primals.size(); ++i) {
    if (!wanted[i]) continue;
    const at::Tensor& p = primals[i];
    args[i] = create_graph && p.requires_grad() ? p.view_as(p) : p.detach().requires_grad_(true);
    inputs.push_back(args[i]);
  }
  const variable_list outputs = fn(args);
  variable_list differentiated, grads, found;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (cotangents[i].defined() && outputs[i].requires_grad()) {
      differentiated.push_back(outputs[i]);
      grads.push_back(cotangents[i]);
    }
  }
  if (!differentiated.empty() && !inputs.empty()) {
    found = torch::autograd::grad(differentiated, inputs, grads, /*retain_graph=*/create_graph, create_graph,
                                  /*allow_unused=*/true);
  }
  variable_list result(primals.size());
  for (size_t i = 0, k = 0; i < primals.size(); ++i) {
    if (!wanted[i]) continue;
    result[i] = k < found.size() && found[k].defined() ? found[k] : at::zeros_like(primals[i]);
    ++k;
  }
  return result;
}

// batch_norm_backward's (grad_x, grad_weight, grad_bias) in differentiable ATen ops, in the compute
// dtype. In training the statistics are functions of x, and are recomputed from it so that their
// derivatives count; eps is recovered as invstd^-2 - var (a constant), so the values match the saved
// statistics (mean, invstd). Where both operands of an operator record a graph they are named first:
// C++ leaves their order open, and the order the graph's nodes are made in is the order a third
// derivative sums in.
variable_list backward_math(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight, at::Tensor mean,
                            at::Tensor invstd, bool training) {
  const at::ScalarType dtype = mean.scalar_type();
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  std::vector<c10::SymInt> view(x.dim(), 1);  // a per-channel tensor, broadcast against x
  view[1] = x.sym_size(1);
  const at::Tensor xc = x.to(dtype);
  at::Tensor go = grad_out.to(dtype);
  if (training) {
    mean = xc.mean(dims);
    const at::Tensor var = (xc - mean.view_symint(view)).square().mean(dims);
    const at::Tensor eps = invstd.pow(-2) - var.detach();
    invstd = (var + eps).rsqrt();
  }
  const at::Tensor centered = xc - mean.view_symint(view);
  const at::Tensor xhat = centered * invstd.view_symint(view);
  const at::Tensor grad_bias = go.sum(dims);
  const at::Tensor grad_weight = (go * xhat).sum(dims);
  const at::Tensor scale = weight.defined() ? invstd * weight.to(dtype) : invstd;
  if (training) {
    const c10::SymInt n = x.sym_numel() / x.sym_size(1);
    const at::Tensor bias_part = grad_bias.view_symint(view);
    go = go - (bias_part + xhat * grad_weight.view_symint(view)) / n;
  }
  return {(go * scale.view_symint(view)).to(x.scalar_type()), grad_weight, grad_bias};
}

// batch_norm_backward's autograd (double backward): the vjp of backward_math in grad_out, x and
// weight; mean and invstd are constants (the forward marks them non-differentiable).
class BatchNormBackwardFunction : public torch::autograd::Function<BatchNormBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& x,
                               const std::optional<at::Tensor>& weight, const at::Tensor& mean,
                               const at::Tensor& invstd, bool training, bool input_grad) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({grad_out, x, weight.value_or(at::Tensor()), mean, invstd});
    ctx->saved_data["training"] = training;
    auto [grad_x, grad_w, grad_b] =
        below_autograd(handles<Ops>().batch_norm_backward, grad_out, x, weight, mean, invstd, training, input_grad);
    return {grad_x, grad_w, grad_b};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &grad_out = saved[0], &x = saved[1], &w = saved[2], &mean = saved[3], &invstd = saved[4];
    const bool training = ctx->saved_data["training"].toBool();
    // needs_input_grad counts the defined tensor arguments only (an absent weight has no slot).
    const variable_list primals = w.defined() ? variable_list{grad_out, x, w} : variable_list{grad_out, x};
    std::vector<bool> wanted;
    for (size_t i = 0; i < primals.size(); ++i) wanted.push_back(ctx->needs_input_grad(i));
    variable_list found(primals.size());
    if (x.sym_numel() == 0) {
      for (size_t i = 0; i < primals.size(); ++i) {
        if (wanted[i]) found[i] = at::zeros_like(primals[i]);
      }
    } else {
      const auto fn = [&](const variable_list& p) {
        return backward_math(p[0], p[1], w.defined() ? p[2] : at::Tensor(), mean, invstd, training);
      };
      // An output nobody differentiated contributes nothing; nor does grad_x when the op returned it
      // empty (input_grad=False), whatever gradient an empty output was given.
      variable_list cotangents = {grads[0], grads[1], grads[2]};
      if (cotangents[0].defined() && cotangents[0].sym_sizes() != x.sym_sizes()) cotangents[0] = at::Tensor();
      found = vjp(fn, primals, cotangents, wanted);
    }
    variable_list out(7);  // one per argument of forward
    out[0] = found[0];
    out[1] = found[1];
    if (w.defined()) out[2] = found[2];
    return out;
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_autograd(
    const at::Tensor& grad_out, const at::Tensor& x, const std::optional<at::Tensor>& weight, const at::Tensor& mean,
    const at::Tensor& invstd, bool training, bool input_grad) {
  const at::Tensor w = weight.value_or(at::Tensor());
  if (!records_grad({&grad_out, &x, &w, &mean, &invstd})) {
    return below_autograd(handles<Ops>().batch_norm_backward, grad_out, x, weight, mean, invstd, training, input_grad);
  }
  const variable_list out = BatchNormBackwardFunction::apply(grad_out, x, weight, mean, invstd, training, input_grad);
  return {out[0], out[1], out[2]};
}

}  // namespace
}  // namespace fastops

TORCH_LIBRARY_IMPL(fastops, Autograd, m) {
  m.impl("batch_norm", &fastops::batch_norm_autograd);
  m.impl("batch_norm_backward", &fastops::batch_norm_backward_autograd);
}

TORCH_LIBRARY_IMPL(fastops, CPU, m) {
  m.impl("batch_norm", FASTOPS_CPU_KERNEL(batch_norm));
  m.impl("batch_norm_backward", FASTOPS_CPU_KERNEL(batch_norm_backward));
}
