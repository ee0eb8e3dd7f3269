// The autocast kernels of our ops, registered from the op's csrc/<op>_op.cpp, one line per op and
// device. Two policies, as aten has them:
//   in_autocast_dtype: conv2d's. The op runs in the autocast dtype of the device (bf16 on the CPU by
//                      default, fp16 on CUDA), whatever dtype arrives; torch.library.register_autocast
//                      cannot state it (it names one fixed dtype).
//   in_float32:        log's. The op runs in float32 (what register_autocast(op, device, float32)
//                      does, without a Python hop).
// An op that runs in the dtype it receives (aten::gelu's policy) registers nothing.
//
// One boxed kernel serves every schema: it casts each tensor argument with at::autocast::cached_cast
// (floating tensors on the device only, never fp64; the cast of a weight to the autocast dtype is
// cached for the autocast region, as aten does for conv2d), then calls the op again with the
// device's autocast key off.
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DeviceType.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace fastops::autocast {

template <c10::DeviceType Device>
constexpr c10::DispatchKey autocast_key() {
  static_assert(Device == c10::DeviceType::CPU || Device == c10::DeviceType::CUDA, "fastops autocasts CPU and CUDA");
  return Device == c10::DeviceType::CUDA ? c10::DispatchKey::AutocastCUDA : c10::DispatchKey::AutocastCPU;
}

// The dtype an op runs in under autocast.
enum class Policy { kAutocastDtype, kFloat32 };

template <c10::DeviceType Device, Policy P>
void run_cast(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key<Device>());
  const at::ScalarType dtype = P == Policy::kFloat32 ? at::kFloat : at::autocast::get_autocast_dtype(Device);
  const size_t num_args = op.schema().arguments().size();
  for (auto arg = stack->end() - static_cast<std::ptrdiff_t>(num_args); arg != stack->end(); ++arg) {
    if (arg->isTensor()) *arg = at::autocast::cached_cast(dtype, arg->toTensor(), Device);
  }
  op.callBoxed(stack);
}

// The kernels to register for an op under the Autocast key of Device.
template <c10::DeviceType Device>
torch::CppFunction in_autocast_dtype() {
  return torch::CppFunction::makeFromBoxedFunction<&run_cast<Device, Policy::kAutocastDtype>>();
}

template <c10::DeviceType Device>
torch::CppFunction in_float32() {
  return torch::CppFunction::makeFromBoxedFunction<&run_cast<Device, Policy::kFloat32>>();
}

}  // namespace fastops::autocast
