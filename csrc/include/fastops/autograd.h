// Calling our ops from an Autograd kernel (csrc/<op>_op.cpp): below the autograd keys for the device
// kernel, or through autograd when the backward's own graph is recorded (create_graph); and the
// double backward of an elementwise op's backward op.
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fastops/op_handle.h>
#include <torch/autograd.h>

#include <cstddef>
#include <initializer_list>
#include <tuple>
#include <utility>

namespace fastops {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

// Whether a call records a graph: grad mode on and an input that requires grad.
inline bool records_grad(std::initializer_list<const at::Tensor*> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : inputs) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

// The autograd of the backward op of an elementwise op y = f(x; args) (its double backward):
// grad_x = backward(g, x, args...) = g * f'(x) is linear in g, so its gradient in g is the backward op
// again, applied to the incoming gradient gg (through autograd when this graph is recorded too: a
// third derivative), and its gradient in x is gg * g * f''(x), which Rule::grad_x writes in
// differentiable ATen ops. Rule has `static const Handle& op()`, the backward op, and
// `static at::Tensor grad_x(gg, g, x, const Args&...)`; Args are the op's non-tensor arguments, as
// stored types (std::string for a str).
template <typename Rule, typename... Args>
class ElementwiseBackwardFunction : public torch::autograd::Function<ElementwiseBackwardFunction<Rule, Args...>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad_out, const at::Tensor& x,
                            const Args&... args) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({grad_out, x});
    ctx->saved_data["args"] = std::make_tuple(args...);
    return below_autograd(Rule::op(), grad_out, x, args...);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(2 + sizeof...(Args));  // one per argument of forward
    if (!grads[0].defined()) return out;
    const variable_list saved = ctx->get_saved_variables();
    const auto args = ctx->saved_data["args"].to<std::tuple<Args...>>();
    std::apply(
        [&](const Args&... a) {
          if (ctx->needs_input_grad(0)) out[0] = backward_call(Rule::op(), grads[0], saved[1], a...);
          if (ctx->needs_input_grad(1)) out[1] = Rule::grad_x(grads[0], saved[0], saved[1], a...);
        },
        args);
    return out;
  }

  // The backward op's Autograd kernel: straight below autograd when the call records no gradient.
  static at::Tensor call(const at::Tensor& grad_out, const at::Tensor& x, const Args&... args) {
    if (!records_grad({&grad_out, &x})) return below_autograd(Rule::op(), grad_out, x, args...);
    return ElementwiseBackwardFunction::apply(grad_out, x, args...);
  }
};

}  // namespace fastops
