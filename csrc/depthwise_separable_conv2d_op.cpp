// depthwise_separable_conv2d, the op: its schema and its autocast policy (it runs in the autocast
// dtype, as conv2d does: fastops/autocast.h). The CPU kernel is cpu/depthwise_separable_conv2d.cpp
// (there is no CUDA kernel: on CUDA its module runs the unfused pair); the fake kernel and the
// autograd in fastops/ops/depthwise_separable_conv2d.py.
#include <c10/core/DeviceType.h>
#include <fastops/autocast.h>
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(fastops, m) {
  // depthwise_separable_conv2d: depthwise (groups=C) then 1x1 conv, fused on the CPU (NHWC tiles,
  // the depthwise output never stored); fastops/ops/depthwise_separable_conv2d.py
  m.def(
      "depthwise_separable_conv2d(Tensor x, Tensor dw_weight, Tensor? dw_bias, Tensor pw_weight, Tensor? pw_bias, "
      "int[2] stride, int[4] padding, int[2] dilation) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastops, AutocastCPU, m) {
  m.impl("depthwise_separable_conv2d", fastops::autocast::in_autocast_dtype<c10::DeviceType::CPU>());
}
