// clipped_log, the op: its schemas, its autograd (first and second derivative) and its autocast rule.
// The device kernels are in cpu/clipped_log.cpp and cuda/clipped_log.cu; the fake kernels in
// fastops/ops/clipped_log.py.
//
// The Autograd kernels are C++ (torch::autograd::Function) so that no Python runs on the way of a
// call: registered from Python every call entered a Python kernel at the Autograd key (a 0-element
// gelu cost 9.2 us against eager's 1.4, forward + backward 56 us against 20; torch 2.13). A call with
// no gradient to record goes straight below autograd; one that records runs the Function, whose
// backward calls the backward op below autograd too, or through autograd with create_graph. Then
// the backward op's own Function (below) gives the double backward, in differentiable ATen math.
//
// Autocast: torch.log runs in float32 under autocast; so does its clipped twin (fastops/autocast.h).
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/where.h>
#include <c10/core/DeviceType.h>
#include <fastops/autocast.h>
#include <fastops/autograd.h>
#include <fastops/cpu_capability.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

// The CPU kernels (cpu/clipped_log.cpp), one per ISA level; the running level's are registered below.
FASTOPS_DECLARE_CPU_KERNEL(clipped_log, at::Tensor(const at::Tensor&, double, bool))
FASTOPS_DECLARE_CPU_KERNEL(clipped_log_backward, at::Tensor(const at::Tensor&, const at::Tensor&, double, bool))

TORCH_LIBRARY_FRAGMENT(fastops, m) {
  // clipped_log: log(clamp(x, min=eps)); fastops/ops/clipped_log.py
  m.def("clipped_log(Tensor x, float eps, bool straight_through) -> Tensor");
  m.def("clipped_log_backward(Tensor grad_out, Tensor x, float eps, bool straight_through) -> Tensor");
}

namespace fastops {
namespace {

using ClippedLogSig = at::Tensor(const at::Tensor&, double, bool);
using ClippedLogBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, double, bool);

// The ops this file calls through the dispatcher (so that each device's kernel runs), looked up once.
struct Ops {
  c10::TypedOperatorHandle<ClippedLogSig> clipped_log = find_op<ClippedLogSig>("fastops::clipped_log");
  c10::TypedOperatorHandle<ClippedLogBackwardSig> clipped_log_backward =
      find_op<ClippedLogBackwardSig>("fastops::clipped_log_backward");
};

class ClippedLogFunction : public torch::autograd::Function<ClippedLogFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double eps, bool straight_through) {
    ctx->save_for_backward({x});  // the only saved tensor: the output is not needed
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["straight_through"] = straight_through;
    return below_autograd(handles<Ops>().clipped_log, x, eps, straight_through);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const double eps = ctx->saved_data["eps"].toDouble();
    const bool straight_through = ctx->saved_data["straight_through"].toBool();
    return {backward_call(handles<Ops>().clipped_log_backward, grads[0], x, eps, straight_through), at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor clipped_log_autograd(const at::Tensor& x, double eps, bool straight_through) {
  if (!records_grad({&x})) return below_autograd(handles<Ops>().clipped_log, x, eps, straight_through);
  return ClippedLogFunction::apply(x, eps, straight_through);
}

// clipped_log_backward's autograd (double backward; fastops/autograd.h). grad_x = mask * g / c(x)
// with c(x) = clamp(x, eps) and mask = 1 (straight-through) or x >= eps: d/dg = mask / c(x) (the
// backward op itself); d/dx = -g / c(x)^2 where x >= eps (c is flat below, and the mask does not
// depend on x).
struct ClippedLogBackwardRule {
  static const c10::TypedOperatorHandle<ClippedLogBackwardSig>& op() { return handles<Ops>().clipped_log_backward; }
  static at::Tensor grad_x(const at::Tensor& grad_grad_x, const at::Tensor& grad_out, const at::Tensor& x, double eps,
                           bool /*straight_through*/) {
    // One operation a statement: the order the graph's nodes are made in is the order a third
    // derivative sums in, and C++ leaves the order of an operator's operands open.
    const at::Tensor above = x.ge(eps);
    const at::Tensor numerator = -grad_grad_x * grad_out;
    const at::Tensor clamped = x.clamp_min(eps);
    return at::where(above, numerator / (clamped * clamped), 0.0);
  }
};

at::Tensor clipped_log_backward_autograd(const at::Tensor& grad_out, const at::Tensor& x, double eps,
                                         bool straight_through) {
  return ElementwiseBackwardFunction<ClippedLogBackwardRule, double, bool>::call(grad_out, x, eps, straight_through);
}

}  // namespace
}  // namespace fastops

TORCH_LIBRARY_IMPL(fastops, Autograd, m) {
  m.impl("clipped_log", &fastops::clipped_log_autograd);
  m.impl("clipped_log_backward", &fastops::clipped_log_backward_autograd);
}

TORCH_LIBRARY_IMPL(fastops, AutocastCPU, m) {
  m.impl("clipped_log", fastops::autocast::in_float32<c10::DeviceType::CPU>());
}

TORCH_LIBRARY_IMPL(fastops, AutocastCUDA, m) {
  m.impl("clipped_log", fastops::autocast::in_float32<c10::DeviceType::CUDA>());
}

TORCH_LIBRARY_IMPL(fastops, CPU, m) {
  m.impl("clipped_log", FASTOPS_CPU_KERNEL(clipped_log));
  m.impl("clipped_log_backward", FASTOPS_CPU_KERNEL(clipped_log_backward));
}
