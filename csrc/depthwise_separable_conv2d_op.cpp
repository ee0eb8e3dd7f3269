// depthwise_separable_conv2d, the op: its schema, its Autograd kernel and its autocast policy (it runs
// in the autocast dtype, as conv2d does: fastops/autocast.h). The CPU kernel is
// cpu/depthwise_separable_conv2d.cpp (there is no CUDA kernel: a CUDA call is refused below, by name;
// on CUDA its module runs the unfused pair); the fake kernel in fastops/ops/depthwise_separable_conv2d.py.
//
// The autograd lives here, not with depthwise_conv2d: the op is not a composite of the two convs (its
// forward is one fused kernel that never stores the depthwise output z), so its derivative is its own
// formula. The backward recomputes z with depthwise_conv2d, takes the 1x1's gradients as two GEMMs on
// the channels_last views, and the depthwise gradients from depthwise_conv2d's backward ops, all
// through the dispatcher (each device's kernel, and their own autograd when the backward's graph is
// recorded). Like the other ops' Autograd kernels it is C++ so that no Python runs on a call's way.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/matmul.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>
#include <fastops/autocast.h>
#include <fastops/autograd.h>
#include <fastops/checks.h>
#include <fastops/cpu_capability.h>
#include <fastops/depthwise_ops.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

// The CPU kernels (cpu/depthwise_separable_conv2d.cpp), one per ISA level; the running level's are registered below.
FASTOPS_DECLARE_CPU_KERNEL(depthwise_separable_conv2d,
                           at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                      const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
                                      at::IntArrayRef, at::IntArrayRef))

TORCH_LIBRARY_FRAGMENT(fastops, m) {
  // depthwise_separable_conv2d: depthwise (groups=C) then 1x1 conv, fused on the CPU (NHWC tiles,
  // the depthwise output never stored); fastops/ops/depthwise_separable_conv2d.py
  m.def(
      "depthwise_separable_conv2d(Tensor x, Tensor dw_weight, Tensor? dw_bias, Tensor pw_weight, Tensor? pw_bias, "
      "int[2] stride, int[4] padding, int[2] dilation) -> Tensor");
}

namespace fastops {
namespace {

using SeparableSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef, at::IntArrayRef,
                                at::IntArrayRef);
// The op itself, called below autograd from its Autograd kernel, looked up once (depthwise_conv2d's
// ops: fastops/depthwise_ops.h).
struct Ops {
  c10::TypedOperatorHandle<SeparableSig> separable = find_op<SeparableSig>("fastops::depthwise_separable_conv2d");
};

class SeparableFunction : public torch::autograd::Function<SeparableFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& dw_weight,
                            const std::optional<at::Tensor>& dw_bias, const at::Tensor& pw_weight,
                            const std::optional<at::Tensor>& pw_bias, std::vector<int64_t> stride,
                            std::vector<int64_t> padding, std::vector<int64_t> dilation) {
    // z is not saved (the forward never stores it): the backward recomputes it from x and the
    // depthwise weights.
    ctx->save_for_backward({x, dw_weight, dw_bias.value_or(at::Tensor()), pw_weight});
    ctx->saved_data["has_pw_bias"] = pw_bias.has_value() && pw_bias->defined();
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    return below_autograd(handles<Ops>().separable, x, dw_weight, dw_bias, pw_weight, pw_bias, stride, padding,
                          dilation);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &dw_weight = saved[1], &dw_bias = saved[2], &pw_weight = saved[3];
    const std::vector<int64_t> stride = ctx->saved_data["stride"].toIntVector();
    const std::vector<int64_t> padding = ctx->saved_data["padding"].toIntVector();
    const std::vector<int64_t> dilation = ctx->saved_data["dilation"].toIntVector();
    // needs_input_grad counts the tensors given only (an absent bias has no index).
    const bool has_dw_bias = dw_bias.defined(), has_pw_bias = ctx->saved_data["has_pw_bias"].toBool();
    const size_t pw_index = has_dw_bias ? 3 : 2;
    const bool need_x = ctx->needs_input_grad(0), need_dw = ctx->needs_input_grad(1);
    const bool need_db = has_dw_bias && ctx->needs_input_grad(2), need_pw = ctx->needs_input_grad(pw_index);
    const bool need_pb = has_pw_bias && ctx->needs_input_grad(pw_index + 1);
    const c10::SymInt cout = pw_weight.sym_size(0), c = pw_weight.sym_size(1);
    const auto nhwc = [](const at::Tensor& t) { return t.contiguous(at::MemoryFormat::ChannelsLast); };
    // (M, Cout) view of the channels_last gradient, M = N*OH*OW.
    const at::Tensor g = nhwc(grads[0]).permute({0, 2, 3, 1}).reshape_symint({-1, cout});
    at::Tensor grad_x, grad_dw, grad_db, grad_pw, grad_pb;
    if (need_pw) {
      const std::optional<at::Tensor> bias = has_dw_bias ? std::optional<at::Tensor>(dw_bias) : std::nullopt;
      const at::Tensor z =
          backward_call(handles<DepthwiseOps>().forward, nhwc(x), dw_weight, bias, stride, padding, dilation);
      const at::Tensor zm = z.permute({0, 2, 3, 1}).reshape_symint({-1, c});
      grad_pw = at::matmul(g.t(), zm).reshape_symint({cout, c, 1, 1});
    }
    if (need_pb) grad_pb = g.sum(0);
    if (need_x || need_dw || need_db) {
      const c10::SymIntArrayRef out_size = grads[0].sym_sizes();
      // dL/dz as a channels_last (N, C, OH, OW) tensor.
      const at::Tensor gz = at::matmul(g, pw_weight.reshape_symint({cout, c}))
                                .reshape_symint({out_size[0], out_size[2], out_size[3], c})
                                .permute({0, 3, 1, 2});
      if (need_x) {
        grad_x = backward_call(handles<DepthwiseOps>().backward_input, gz, dw_weight, x.sym_sizes(), stride, padding,
                               dilation, true);
      }
      if (need_dw || need_db) {
        std::tie(grad_dw, grad_db) =
            backward_call(handles<DepthwiseOps>().backward_weight, gz, nhwc(x),
                          at::IntArrayRef{dw_weight.size(2), dw_weight.size(3)}, stride, padding, dilation);
        if (!has_dw_bias) grad_db = at::Tensor();
      }
    }
    return {grad_x, grad_dw, grad_db, grad_pw, grad_pb, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor separable_autograd(const at::Tensor& x, const at::Tensor& dw_weight,
                              const std::optional<at::Tensor>& dw_bias, const at::Tensor& pw_weight,
                              const std::optional<at::Tensor>& pw_bias, at::IntArrayRef stride, at::IntArrayRef padding,
                              at::IntArrayRef dilation) {
  const at::Tensor db = dw_bias.value_or(at::Tensor()), pb = pw_bias.value_or(at::Tensor());
  if (!records_grad({&x, &dw_weight, &db, &pw_weight, &pb})) {
    return below_autograd(handles<Ops>().separable, x, dw_weight, dw_bias, pw_weight, pw_bias, stride, padding,
                          dilation);
  }
  return SeparableFunction::apply(x, dw_weight, dw_bias, pw_weight, pw_bias, stride.vec(), padding.vec(),
                                  dilation.vec());
}

}  // namespace
}  // namespace fastops

TORCH_LIBRARY_IMPL(fastops, Autograd, m) { m.impl("depthwise_separable_conv2d", &fastops::separable_autograd); }

TORCH_LIBRARY_IMPL(fastops, AutocastCPU, m) {
  m.impl("depthwise_separable_conv2d", fastops::autocast::in_autocast_dtype<c10::DeviceType::CPU>());
}

namespace fastops {
namespace {

// Registered for CUDA in every build (a CPU-only build of fastops can run on a CUDA torch), so that a
// CUDA call names the alternative instead of the dispatcher's "could not run ... with the CUDA backend".
at::Tensor depthwise_separable_conv2d_cuda_refused(const at::Tensor& x, const at::Tensor&,
                                                   const std::optional<at::Tensor>&, const at::Tensor&,
                                                   const std::optional<at::Tensor>&, at::IntArrayRef, at::IntArrayRef,
                                                   at::IntArrayRef) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "fastops.depthwise_separable_conv2d: only a CPU kernel exists (got x on ",
                              str(x.device()), "); on CUDA use fastops.depthwise_conv2d followed by a 1x1 conv");
}

}  // namespace
}  // namespace fastops

TORCH_LIBRARY_IMPL(fastops, CUDA, m) {
  m.impl("depthwise_separable_conv2d", &fastops::depthwise_separable_conv2d_cuda_refused);
}

TORCH_LIBRARY_IMPL(fastops, CPU, m) {
  m.impl("depthwise_separable_conv2d", FASTOPS_CPU_KERNEL(depthwise_separable_conv2d));
}
