// fused_adam_, the op: its schema. The device kernels are in cpu/fused_adam.cpp and
// cuda/fused_adam.cu; the optimizer classes that call it in fastops/optim/fused_adam.py.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(fastops, m) {
  // fused_adam_: one Adam/AdamW step over lists of tensors; fastops/optim/fused_adam.py.
  // lr_tensor, when given, replaces lr. grads are written back unscaled when grad_scale is given.
  m.def(
      "fused_adam_(Tensor(a!)[] params, Tensor(b!)[] grads, Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, "
      "Tensor(e!)[] max_exp_avg_sqs, Tensor(f!)[] steps, Tensor? lr_tensor, float lr, float beta1, float beta2, "
      "float weight_decay, float eps, bool amsgrad, bool maximize, bool decoupled_weight_decay, "
      "Tensor? grad_scale=None, Tensor? found_inf=None) -> ()");
}
