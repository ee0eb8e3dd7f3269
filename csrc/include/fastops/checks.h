// Input checks shared by every op. Each message names the op and the argument, and says what was
// expected, so a user can fix the call without reading our source.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace fastops {

// Floating dtypes every op accepts; fp64 is accepted on the CPU (gradcheck needs it).
inline void check_floating(const char* op, const char* arg, const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  const bool ok = dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 ||
                  (dtype == at::kDouble && t.device().is_cpu());
  TORCH_CHECK(ok, "fastops.", op, ": expected ", arg, " to be a float32, float16 or bfloat16 tensor",
              t.device().is_cpu() ? " (or float64 on the CPU)" : "", ", got ", dtype, " on ", t.device());
}

inline void check_same_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                              const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), "fastops.", op, ": expected ", arg, " on the same device as ", ref_arg, " (",
              ref.device(), "), got ", t.device());
}

inline void check_same_dtype(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                             const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "fastops.", op, ": expected ", arg, " to have the dtype of ",
              ref_arg, " (", ref.scalar_type(), "), got ", t.scalar_type());
}

inline void check_same_shape(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                             const at::Tensor& ref) {
  TORCH_CHECK(t.sizes() == ref.sizes(), "fastops.", op, ": expected ", arg, " to have the shape of ", ref_arg, " ",
              ref.sizes(), ", got ", t.sizes());
}

inline void check_positive_finite(const char* op, const char* arg, double value) {
  TORCH_CHECK(std::isfinite(value) && value > 0.0, "fastops.", op, ": expected ", arg,
              " to be a finite number > 0, got ", value);
}

// Elementwise kernels walk memory flat. A tensor qualifies when it is non-overlapping and dense
// (contiguous, channels_last, transposed, ...): its numel elements then fill one block of memory
// starting at data_ptr(), and empty_like() gives an output with the same strides. A tensor that is
// not dense is first copied into the layout empty_like() would give it, so the output's strides are
// always those of torch.empty_like(input), which is what the fake kernels promise.
inline at::Tensor densify(const at::Tensor& t) {
  return t.is_non_overlapping_and_dense() ? t : at::empty_like(t).copy_(t);
}

// `t` in the exact strides of the dense tensor `ref`, copying only when they differ.
inline at::Tensor match_layout(const at::Tensor& t, const at::Tensor& ref) {
  return t.strides() == ref.strides() ? t : at::empty_like(ref).copy_(t);
}

}  // namespace fastops
