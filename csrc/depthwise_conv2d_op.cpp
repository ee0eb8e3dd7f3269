// depthwise_conv2d, the op: its schemas, its Autograd kernel and its autocast policy. The device
// kernels are in cpu/depthwise_conv2d*.cpp and cuda/depthwise_conv2d.cu; the fake kernels in
// fastops/ops/depthwise_conv2d.py. The backward ops have no autograd of their own (no double
// backward: through them torch's fallback warns and passes no gradient).
//
// The Autograd kernel is C++ (a torch::autograd::Function) so that no Python runs on the way of a
// call: registered from Python every call entered a Python kernel at the Autograd key (a 0-element
// gelu cost 9.2 us against eager's 1.4, forward + backward 56 us against 20; torch 2.13). A call with
// no gradient to record goes straight below autograd; one that records runs the Function, whose
// backward calls the backward ops below autograd too, or through autograd with create_graph.
//
// Autocast: the op runs in the autocast dtype, as conv2d does (fastops/autocast.h), a policy that
// torch.library.register_autocast cannot state (it names one fixed dtype). The Autocast keys exist in
// every torch build, so both register in the CPU-only build too.
#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceType.h>
#include <fastops/autocast.h>
#include <fastops/autograd.h>
#include <fastops/checks.h>
#include <fastops/cpu_capability.h>
#include <fastops/depthwise_ops.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

// The CPU kernels (cpu/depthwise_conv2d.cpp), one per ISA level; the running level's are registered below.
FASTOPS_DECLARE_CPU_KERNEL(depthwise_conv2d,
                           at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                      at::IntArrayRef, at::IntArrayRef, at::IntArrayRef))
FASTOPS_DECLARE_CPU_KERNEL(depthwise_conv2d_backward_input,
                           at::Tensor(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, at::IntArrayRef,
                                      at::IntArrayRef, at::IntArrayRef, bool))
FASTOPS_DECLARE_CPU_KERNEL(depthwise_conv2d_backward_weight,
                           std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, at::IntArrayRef,
                                                              at::IntArrayRef, at::IntArrayRef, at::IntArrayRef))

TORCH_LIBRARY_FRAGMENT(fastops, m) {
  // depthwise_conv2d: F.conv2d(x, w, b, stride, padding, dilation, groups=C); padding is
  // (top, bottom, left, right); fastops/ops/depthwise_conv2d.py
  m.def(
      "depthwise_conv2d(Tensor x, Tensor weight, Tensor? bias, int[2] stride, int[4] padding, int[2] dilation) "
      "-> Tensor");
  m.def(
      "depthwise_conv2d_backward_input(Tensor grad_out, Tensor weight, SymInt[4] input_size, int[2] stride, "
      "int[4] padding, int[2] dilation, bool channels_last) -> Tensor");
  m.def(
      "depthwise_conv2d_backward_weight(Tensor grad_out, Tensor x, int[2] kernel_size, int[2] stride, "
      "int[4] padding, int[2] dilation) -> (Tensor, Tensor)");
}

namespace fastops {
namespace {

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
    return below_autograd(handles<DepthwiseOps>().forward, x, weight, bias, stride, padding, dilation);
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
      grad_x = backward_call(handles<DepthwiseOps>().backward_input, grads[0], weight, x.sym_sizes(), stride, padding,
                             dilation, ctx->saved_data["channels_last"].toBool());
    }
    if (ctx->needs_input_grad(1) || (has_bias && ctx->needs_input_grad(2))) {
      std::tie(grad_w, grad_b) =
          backward_call(handles<DepthwiseOps>().backward_weight, grads[0], x,
                        at::IntArrayRef{weight.size(2), weight.size(3)}, stride, padding, dilation);
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
    return below_autograd(handles<DepthwiseOps>().forward, x, weight, bias, stride, padding, dilation);
  }
  return DepthwiseFunction::apply(x, weight, bias, stride.vec(), padding.vec(), dilation.vec());
}

}  // namespace
}  // namespace fastops

TORCH_LIBRARY_IMPL(fastops, Autograd, m) { m.impl("depthwise_conv2d", &fastops::depthwise_autograd); }

TORCH_LIBRARY_IMPL(fastops, AutocastCPU, m) {
  m.impl("depthwise_conv2d", fastops::autocast::in_autocast_dtype<c10::DeviceType::CPU>());
}

TORCH_LIBRARY_IMPL(fastops, AutocastCUDA, m) {
  m.impl("depthwise_conv2d", fastops::autocast::in_autocast_dtype<c10::DeviceType::CUDA>());
}

TORCH_LIBRARY_IMPL(fastops, CPU, m) {
  m.impl("depthwise_conv2d", FASTOPS_CPU_KERNEL(depthwise_conv2d));
  m.impl("depthwise_conv2d_backward_input", FASTOPS_CPU_KERNEL(depthwise_conv2d_backward_input));
  m.impl("depthwise_conv2d_backward_weight", FASTOPS_CPU_KERNEL(depthwise_conv2d_backward_weight));
}
