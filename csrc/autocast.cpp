// Autocast policies that torch.library.register_autocast cannot state (it names one fixed dtype):
// the ops here run in the autocast dtype, as conv2d does (fastops/autocast.h). Device-neutral: the
// Autocast keys exist in every torch build, so both blocks register in the CPU-only build too, and
// each exactly once. The other ops state their policy in fastops/ops/<op>.py.
#include <c10/core/DeviceType.h>
#include <fastops/autocast.h>
#include <torch/library.h>

using fastops::autocast::in_autocast_dtype;

TORCH_LIBRARY_IMPL(fastops, AutocastCPU, m) {
  m.impl("depthwise_conv2d", in_autocast_dtype<c10::DeviceType::CPU>());
  m.impl("depthwise_separable_conv2d", in_autocast_dtype<c10::DeviceType::CPU>());
}

// depthwise_separable_conv2d has no CUDA kernel (on CUDA its module runs the unfused pair).
TORCH_LIBRARY_IMPL(fastops, AutocastCUDA, m) { m.impl("depthwise_conv2d", in_autocast_dtype<c10::DeviceType::CUDA>()); }
