// fused_adam_, the op: its schema, its version-counter bump and the registration of its CPU kernel.
// The device kernels are in cpu/fused_adam.cpp and cuda/fused_adam.cu; the optimizer classes that
// call it in fastops/optim/fused_adam.py.
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>
#include <fastops/cpu_capability.h>
#include <torch/library.h>

#include <optional>

FASTOPS_DECLARE_CPU_KERNEL(fused_adam_, void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                                             at::TensorList, at::TensorList, const std::optional<at::Tensor>&, double,
                                             double, double, double, double, bool, bool, bool,
                                             const std::optional<at::Tensor>&, const std::optional<at::Tensor>&))

TORCH_LIBRARY_FRAGMENT(fastops, m) {
  // fused_adam_: one Adam/AdamW step over lists of tensors; fastops/optim/fused_adam.py.
  // lr_tensor, when given, replaces lr. grads are written back unscaled when grad_scale is given.
  m.def(
      "fused_adam_(Tensor(a!)[] params, Tensor(b!)[] grads, Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, "
      "Tensor(e!)[] max_exp_avg_sqs, Tensor(f!)[] steps, Tensor? lr_tensor, float lr, float beta1, float beta2, "
      "float weight_decay, float eps, bool amsgrad, bool maximize, bool decoupled_weight_decay, "
      "Tensor? grad_scale=None, Tensor? found_inf=None) -> ()");
}

namespace fastops {
namespace {

// Version counters: like every in-place torch op, fused_adam_ bumps the version of each tensor it may
// mutate, so autograd still detects "a saved tensor was modified in place" after opt.step(). (The
// autograd fallback skips this under no_grad, where optimizers run.) Device independent: registered
// once, for every backend.
void fused_adam_bump_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto num_args = static_cast<int64_t>(op.schema().arguments().size());
  const auto first = static_cast<int64_t>(stack->size()) - num_args;
  for (int64_t i = 0; i < num_args; ++i) {
    const auto* alias = op.schema().arguments()[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    for (const at::Tensor& t : (*stack)[first + i].toTensorList()) t.unsafeGetTensorImpl()->bump_version();
  }
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
}

}  // namespace
}  // namespace fastops

TORCH_LIBRARY_IMPL(fastops, ADInplaceOrView, m) {
  m.impl("fused_adam_", torch::CppFunction::makeFromBoxedFunction<&fastops::fused_adam_bump_versions>());
}

TORCH_LIBRARY_IMPL(fastops, CPU, m) { m.impl("fused_adam_", FASTOPS_CPU_KERNEL(fused_adam_)); }
