// gelu and bias_gelu, the ops: their schemas and their autograd, first and second derivative. The
// device kernels are in cpu/gelu.cpp and cuda/gelu.cu; the fake kernels in fastops/ops/gelu.py. No
// autocast rule: like aten::gelu it runs in the dtype it receives.
//
// The Autograd kernels are C++ (torch::autograd::Function) so that no Python runs on the way of a
// call: registered from Python every call entered a Python kernel at the Autograd key (a 0-element
// gelu cost 9.2 us against eager's 1.4, forward + backward 56 us against 20; torch 2.13). A call with
// no gradient to record goes straight below autograd; one that records runs the Function, whose
// backward calls the backward op below autograd too, or through autograd with create_graph. Then
// the backward op's own Function (below) gives the double backward, in differentiable ATen math
// (gelu'' is one derivative past what the kernels compute, and rare enough not to need a kernel), so
// a third derivative works as well.
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/rsub.h>
#include <ATen/ops/sigmoid.h>
#include <fastops/autograd.h>
#include <fastops/cpu_capability.h>
#include <fastops/gelu_math.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

// The CPU kernels (cpu/gelu.cpp), one per ISA level; the running level's are registered below.
FASTOPS_DECLARE_CPU_KERNEL(gelu, at::Tensor(const at::Tensor&, std::string_view))
FASTOPS_DECLARE_CPU_KERNEL(gelu_backward, at::Tensor(const at::Tensor&, const at::Tensor&, std::string_view))
FASTOPS_DECLARE_CPU_KERNEL(bias_gelu, at::Tensor(const at::Tensor&, const at::Tensor&, std::string_view))
FASTOPS_DECLARE_CPU_KERNEL(bias_gelu_backward, std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                                  const at::Tensor&, std::string_view))

TORCH_LIBRARY_FRAGMENT(fastops, m) {
  // gelu: gelu(x) and gelu(x + bias), approximate "none" (erf) or "tanh"; fastops/ops/gelu.py
  m.def("gelu(Tensor x, str approximate) -> Tensor");
  m.def("gelu_backward(Tensor grad_out, Tensor x, str approximate) -> Tensor");
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate) -> Tensor");
  m.def("bias_gelu_backward(Tensor grad_out, Tensor x, Tensor bias, str approximate) -> (Tensor, Tensor)");
}

namespace fastops {
namespace {

using GeluSig = at::Tensor(const at::Tensor&, c10::string_view);
using GeluBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);
using BiasGeluSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);
using BiasGeluBackwardSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                               c10::string_view);

// The ops this file calls through the dispatcher (so that each device's kernel runs), looked up once.
struct Ops {
  c10::TypedOperatorHandle<GeluSig> gelu = find_op<GeluSig>("fastops::gelu");
  c10::TypedOperatorHandle<GeluBackwardSig> gelu_backward = find_op<GeluBackwardSig>("fastops::gelu_backward");
  c10::TypedOperatorHandle<BiasGeluSig> bias_gelu = find_op<BiasGeluSig>("fastops::bias_gelu");
  c10::TypedOperatorHandle<BiasGeluBackwardSig> bias_gelu_backward =
      find_op<BiasGeluBackwardSig>("fastops::bias_gelu_backward");
};

class GeluFunction : public torch::autograd::Function<GeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::string& approximate) {
    ctx->save_for_backward({x});  // the output is not needed: the backward kernel recomputes from x
    ctx->saved_data["approximate"] = approximate;
    return below_autograd(handles<Ops>().gelu, x, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    return {backward_call(handles<Ops>().gelu_backward, grads[0], x, approximate), at::Tensor()};
  }
};

at::Tensor gelu_autograd(const at::Tensor& x, c10::string_view approximate) {
  if (!records_grad({&x})) return below_autograd(handles<Ops>().gelu, x, approximate);
  return GeluFunction::apply(x, std::string(approximate));
}

class BiasGeluFunction : public torch::autograd::Function<BiasGeluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias,
                            const std::string& approximate) {
    ctx->save_for_backward({x, bias});  // x + bias is recomputed in the backward kernel, never stored
    ctx->saved_data["approximate"] = approximate;
    return below_autograd(handles<Ops>().bias_gelu, x, bias, approximate);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    auto [grad_x, grad_bias] =
        backward_call(handles<Ops>().bias_gelu_backward, grads[0], saved[0], saved[1], approximate);
    return {grad_x, grad_bias, at::Tensor()};
  }
};

at::Tensor bias_gelu_autograd(const at::Tensor& x, const at::Tensor& bias, c10::string_view approximate) {
  if (!records_grad({&x, &bias})) return below_autograd(handles<Ops>().bias_gelu, x, bias, approximate);
  return BiasGeluFunction::apply(x, bias, std::string(approximate));
}

// gelu''(x) in differentiable ATen ops (double backward only).
//   erf:  gelu' = Phi + x phi,  gelu'' = phi * (2 - x^2).
//   tanh: s = sigmoid(2y), y = k (x + c x^3); gelu' = s + x s',  s' = 2 s (1-s) y';
//         gelu'' = 2 s' + x s'',  s'' = 2 s (1-s) (y'' + 2 (1 - 2s) y'^2).
// One operation a statement where two sides of an operator both record a graph: C++ leaves the order of
// operands open, and the order the graph's nodes are made in is the order the engine sums their
// gradients in, so a third derivative would change in the last bit with the compiler.
at::Tensor gelu_second_derivative(const at::Tensor& x, const std::string& approximate) {
  using gelu_math::kInvSqrt2Pi, gelu_math::kTanhC, gelu_math::kTanhK;
  if (approximate != "tanh") {
    const at::Tensor phi = at::exp(-0.5 * x * x) * kInvSqrt2Pi;
    return phi * at::rsub(x * x, 2.0);
  }
  const at::Tensor y = kTanhK * (x + kTanhC * x * x * x);
  const at::Tensor dy = kTanhK * (1.0 + 3.0 * kTanhC * x * x);
  const at::Tensor d2y = kTanhK * 6.0 * kTanhC * x;
  const at::Tensor s = at::sigmoid(2.0 * y);
  const at::Tensor s1ms = s * at::sigmoid(-2.0 * y);  // s (1 - s) without cancellation
  const at::Tensor ds = 2.0 * s1ms * dy;
  const at::Tensor two_s1ms = 2.0 * s1ms;
  const at::Tensor d2s = two_s1ms * (d2y + 2.0 * at::rsub(2.0 * s, 1.0) * dy * dy);
  const at::Tensor two_ds = 2.0 * ds;
  return two_ds + x * d2s;
}

// g * gg * gelu''(x), the products in the order the graph is to record them (see above).
at::Tensor times_second_derivative(const at::Tensor& grad_grad, const at::Tensor& grad_out, const at::Tensor& x,
                                   const std::string& approximate) {
  const at::Tensor product = grad_grad * grad_out;
  return product * gelu_second_derivative(x, approximate);
}

// gelu_backward's autograd (double backward; fastops/autograd.h): grad_x = g * gelu'(x), so d/dg is
// gelu_backward itself and d/dx = gg * g * gelu''(x).
struct GeluBackwardRule {
  static const c10::TypedOperatorHandle<GeluBackwardSig>& op() { return handles<Ops>().gelu_backward; }
  static at::Tensor grad_x(const at::Tensor& grad_grad_x, const at::Tensor& grad_out, const at::Tensor& x,
                           const std::string& approximate) {
    return times_second_derivative(grad_grad_x, grad_out, x, approximate);
  }
};

at::Tensor gelu_backward_autograd(const at::Tensor& grad_out, const at::Tensor& x, c10::string_view approximate) {
  return ElementwiseBackwardFunction<GeluBackwardRule, std::string>::call(grad_out, x, std::string(approximate));
}

// bias_gelu_backward's autograd (double backward). Outputs: grad_x = g * gelu'(h) and grad_bias =
// sum_rows(grad_x), h = x + bias. Both flow through grad_x, so the upstream gradient of grad_x is
// G = gg_x + gg_bias (broadcast over rows); then as gelu_backward's with h for x, and h's gradient
// goes to x and, summed over rows, to bias.
class BiasGeluBackwardFunction : public torch::autograd::Function<BiasGeluBackwardFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& x,
                               const at::Tensor& bias, const std::string& approximate) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({grad_out, x, bias});
    ctx->saved_data["approximate"] = approximate;
    auto [grad_x, grad_bias] = below_autograd(handles<Ops>().bias_gelu_backward, grad_out, x, bias, approximate);
    return {grad_x, grad_bias};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor &grad_grad_x = grads[0], &grad_grad_bias = grads[1];
    variable_list out(4);  // one per argument of forward
    if (!grad_grad_x.defined() && !grad_grad_bias.defined()) return out;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &grad_out = saved[0], &x = saved[1], &bias = saved[2];
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    at::Tensor upstream = grad_grad_x.defined() ? grad_grad_x : at::zeros_like(x);
    if (grad_grad_bias.defined()) upstream = upstream + grad_grad_bias;
    const at::Tensor h = x + bias;
    if (ctx->needs_input_grad(0)) {
      out[0] = backward_call(handles<Ops>().gelu_backward, upstream.contiguous(), h, approximate);
    }
    if (ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      const at::Tensor grad_h = times_second_derivative(upstream, grad_out, h, approximate);
      if (ctx->needs_input_grad(1)) out[1] = grad_h;
      if (ctx->needs_input_grad(2)) {
        out[2] = x.sym_numel() != 0 ? grad_h.reshape_symint({-1, x.sym_size(-1)}).sum(0) : at::zeros_like(bias);
      }
    }
    return out;
  }
};

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward_autograd(const at::Tensor& grad_out, const at::Tensor& x,
                                                               const at::Tensor& bias, c10::string_view approximate) {
  if (!records_grad({&grad_out, &x, &bias})) {
    return below_autograd(handles<Ops>().bias_gelu_backward, grad_out, x, bias, approximate);
  }
  const variable_list out = BiasGeluBackwardFunction::apply(grad_out, x, bias, std::string(approximate));
  return {out[0], out[1]};
}

}  // namespace
}  // namespace fastops

TORCH_LIBRARY_IMPL(fastops, Autograd, m) {
  m.impl("gelu", &fastops::gelu_autograd);
  m.impl("bias_gelu", &fastops::bias_gelu_autograd);
  m.impl("gelu_backward", &fastops::gelu_backward_autograd);
  m.impl("bias_gelu_backward", &fastops::bias_gelu_backward_autograd);
}

TORCH_LIBRARY_IMPL(fastops, CPU, m) {
  m.impl("gelu", FASTOPS_CPU_KERNEL(gelu));
  m.impl("gelu_backward", FASTOPS_CPU_KERNEL(gelu_backward));
  m.impl("bias_gelu", FASTOPS_CPU_KERNEL(bias_gelu));
  m.impl("bias_gelu_backward", FASTOPS_CPU_KERNEL(bias_gelu_backward));
}
