// The one TORCH_LIBRARY(fastops, m): every schema lives here, one block per op. Kernels register
// themselves per device in cpu/<op>.cpp and cuda/<op>.cu; Python adds fake kernels, autograd and
// autocast rules in fastops/ops/<op>.py.
#include <Python.h>
#include <torch/library.h>

#include <string>

#define FASTOPS_STRINGIFY_(x) #x
#define FASTOPS_STRINGIFY(x) FASTOPS_STRINGIFY_(x)

namespace fastops {
extern PyMethodDef python_methods[];  // csrc/tuner.cpp
}  // namespace fastops

// fastops._C is imported as a Python module (the setup.py build as fastops._C, the JIT build under
// its own name); every op is reached through torch.ops.fastops, and its only Python function is the
// tuner's call key (csrc/tuner.cpp). The init function's name follows the extension's name so the
// same source serves both builds.
#define FASTOPS_CONCAT_(a, b) a##b
#define FASTOPS_CONCAT(a, b) FASTOPS_CONCAT_(a, b)
extern "C" PyObject* FASTOPS_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, FASTOPS_STRINGIFY(TORCH_EXTENSION_NAME),
                                   "fastops compiled kernels (reached through torch.ops.fastops)", -1,
                                   fastops::python_methods};
  return PyModule_Create(&module_def);
}

namespace fastops {

#ifdef FASTOPS_WITH_CUDA
std::string cuda_build_info();  // csrc/cuda/build_info.cu
#endif

// "key=value;..." describing how this binary was compiled; parsed by fastops/info.py.
std::string build_info() {
  std::string info = "cpu_capability=" FASTOPS_STRINGIFY(CPU_CAPABILITY);
#ifdef FASTOPS_WITH_CUDA
  info += ";cuda=1;" + cuda_build_info();
#else
  info += ";cuda=0";
#endif
  return info;
}

}  // namespace fastops

TORCH_LIBRARY(fastops, m) {
  m.def("_build_info() -> str", &fastops::build_info);

  // batch_norm: y = (x - mean) * invstd * weight + bias over dim 1, the statistics of the batch
  // (training) or the running ones (eval); fastops/ops/batch_norm.py. Returns (y, mean, invstd,
  // unbiased_var): mean and invstd in the compute dtype for the backward; unbiased_var (training only,
  // else empty) for the running-statistics update the caller makes. The backward returns (grad_x or
  // an empty tensor unless input_grad, grad_weight, grad_bias); grad_weight and grad_bias in the
  // compute dtype.
  m.def(
      "batch_norm(Tensor x, Tensor? weight, Tensor? bias, Tensor? running_mean, Tensor? running_var, bool training, "
      "float eps) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "batch_norm_backward(Tensor grad_out, Tensor x, Tensor? weight, Tensor mean, Tensor invstd, bool training, "
      "bool input_grad) -> (Tensor, Tensor, Tensor)");

  // clipped_log: log(clamp(x, min=eps)); fastops/ops/clipped_log.py
  m.def("clipped_log(Tensor x, float eps, bool straight_through) -> Tensor");
  m.def("clipped_log_backward(Tensor grad_out, Tensor x, float eps, bool straight_through) -> Tensor");

  // gelu: gelu(x) and gelu(x + bias), approximate "none" (erf) or "tanh"; fastops/ops/gelu.py
  m.def("gelu(Tensor x, str approximate) -> Tensor");
  m.def("gelu_backward(Tensor grad_out, Tensor x, str approximate) -> Tensor");
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate) -> Tensor");
  m.def("bias_gelu_backward(Tensor grad_out, Tensor x, Tensor bias, str approximate) -> (Tensor, Tensor)");

  // squeeze_excite: the memory passes of an SE block x * gate(fc2(act(fc1(mean_hw(x))))); the FCs between
  // them run in ATen. Per-(n, c) tensors are (N, C) in float32
  // (float64 for float64 x). backward_input: grad_out * scale + grad_pool / HW.
  m.def("squeeze_excite_pool(Tensor x) -> Tensor");
  m.def("squeeze_excite_scale(Tensor x, Tensor scale) -> Tensor");
  m.def("squeeze_excite_backward_reduce(Tensor grad_out, Tensor x) -> Tensor");
  m.def("squeeze_excite_backward_input(Tensor grad_out, Tensor scale, Tensor grad_pool) -> Tensor");
  // The whole block, its autograd in C++ (csrc/squeeze_excite_block.cpp): squeeze_excite's backward is
  // squeeze_excite_backward. _forward returns y and the (N, C) / (N, R) intermediates _backward takes;
  // _backward returns (grad_x, grad_fc1_weight, grad_fc1_bias, grad_fc2_weight, grad_fc2_bias) in the
  // compute dtype, grad_x empty unless input_grad.
  m.def(
      "squeeze_excite(Tensor x, Tensor fc1_weight, Tensor? fc1_bias, Tensor fc2_weight, Tensor? fc2_bias, str act, "
      "str gate) -> Tensor");
  m.def(
      "squeeze_excite_forward(Tensor x, Tensor fc1_weight, Tensor? fc1_bias, Tensor fc2_weight, Tensor? fc2_bias, "
      "str act, str gate) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "squeeze_excite_backward(Tensor grad_out, Tensor x, Tensor fc1_weight, Tensor fc2_weight, Tensor pooled, "
      "Tensor hidden, Tensor activated, Tensor pre_gate, Tensor scale, str act, str gate, bool input_grad) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");

  // fused_adam_: one Adam/AdamW step over lists of tensors; fastops/optim/fused_adam.py.
  // lr_tensor, when given, replaces lr. grads are written back unscaled when grad_scale is given.
  m.def(
      "fused_adam_(Tensor(a!)[] params, Tensor(b!)[] grads, Tensor(c!)[] exp_avgs, Tensor(d!)[] exp_avg_sqs, "
      "Tensor(e!)[] max_exp_avg_sqs, Tensor(f!)[] steps, Tensor? lr_tensor, float lr, float beta1, float beta2, "
      "float weight_decay, float eps, bool amsgrad, bool maximize, bool decoupled_weight_decay, "
      "Tensor? grad_scale=None, Tensor? found_inf=None) -> ()");

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
  // depthwise_separable_conv2d: depthwise (groups=C) then 1x1 conv, fused on the CPU (NHWC tiles,
  // the depthwise output never stored); fastops/ops/depthwise_separable_conv2d.py
  m.def(
      "depthwise_separable_conv2d(Tensor x, Tensor dw_weight, Tensor? dw_bias, Tensor pw_weight, Tensor? pw_bias, "
      "int[2] stride, int[4] padding, int[2] dilation) -> Tensor");
}
