// Argument checks and the layout rule of the squeeze_excite kernels, shared by the CPU and CUDA
// kernels (host code only, no ATen beyond Tensor.h, so .cu files can include it).
//
// The four ops are the memory passes of an SE block over x of shape (N, C, H, W); everything per
// (n, c) is an (N, C) contiguous tensor in x's opmath dtype (float32 for fp16/bf16/fp32 x, float64
// for float64 x), so the tiny FCs between them (csrc/squeeze_excite_op.cpp) see float32.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <fastops/checks.h>
#include <fastops/cpu_capability.h>

#include <cstdint>
#include <tuple>

namespace fastops {

// One call's geometry: rows of HW elements per (n, c) (NCHW) or rows of C per (n, hw) (NHWC).
struct SqueezeExciteShape {
  int64_t N, C, HW;
  bool channels_last;
};

inline at::ScalarType se_opmath_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// x (or grad_out): a 4-D floating tensor.
inline void check_se_activation(const char* op, const char* arg, const at::Tensor& t) {
  check_floating(op, arg, t);
  FASTOPS_CHECK_SHAPE(t.dim() == 4, "fastops.", op, ": expected ", arg, " to be 4-D (N, C, H, W), got shape ",
                      str(t.sizes()));
}

// A per-channel tensor: (N, C) of x's opmath dtype on x's device.
inline void check_se_per_channel(const char* op, const char* arg, const at::Tensor& t, const char* x_arg,
                                 const at::Tensor& x) {
  check_same_device(op, arg, t, x_arg, x);
  FASTOPS_CHECK_DTYPE(t.scalar_type() == se_opmath_dtype(x), "fastops.", op, ": expected ", arg, " to be ",
                      str(se_opmath_dtype(x)), " (the compute dtype of ", x_arg, "'s ", str(x.scalar_type()), "), got ",
                      str(t.scalar_type()));
  FASTOPS_CHECK_SHAPE(t.dim() == 2 && t.size(0) == x.size(0) && t.size(1) == x.size(1), "fastops.", op, ": expected ",
                      arg, " of shape ", str(at::IntArrayRef({x.size(0), x.size(1)})), " (N, C), got ", str(t.sizes()));
}

// t in the layout the kernels run in: channels_last or contiguous (a no-op when it already is).
inline at::Tensor se_layout(const at::Tensor& t, bool channels_last) {
  return t.contiguous(channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
}

inline SqueezeExciteShape se_shape(const at::Tensor& x, bool channels_last) {
  return {x.size(0), x.size(1), x.size(2) * x.size(3), channels_last};
}

namespace cpu {
inline constexpr int64_t kFcMaxRows = 16;
}  // namespace cpu

}  // namespace fastops

// The SE block's FCs on the CPU (cpu/squeeze_excite.cpp, AVX-512 level) for a float32 batch of at most
// kFcMaxRows rows: out = input W^T + bias (bias may be undefined), and (input_grad ? g W : undefined,
// g^T input). se_fc_applies says when they run; elsewhere (and at the other levels) the block uses
// ATen's GEMMs. Past 16 rows MKL's register blocking wins (measured: 32 rows 0.84x its forward).
FASTOPS_DECLARE_CPU_KERNEL(se_fc_applies, bool(const at::Tensor&))
FASTOPS_DECLARE_CPU_KERNEL(se_fc_forward, at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&))
FASTOPS_DECLARE_CPU_KERNEL(se_fc_backward, std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                              const at::Tensor&, bool))
