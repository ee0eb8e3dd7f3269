// Calling our ops from an Autograd kernel (csrc/<op>_op.cpp): below the autograd keys for the device
// kernel, or through autograd when the backward's own graph is recorded (create_graph).
#pragma once

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fastops/op_handle.h>
#include <torch/autograd.h>

#include <initializer_list>
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

}  // namespace fastops
