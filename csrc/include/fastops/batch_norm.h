// Argument checks and the layout rule of the batch_norm kernels, shared by the CPU and CUDA kernels
// (host code only, no ATen beyond Tensor.h, so .cu files can include it).
//
// x is (N, C, *) with the channels on dim 1. The kernels see it either as planes (N, C, L) of L
// contiguous elements per (n, c), or as rows of C contiguous channels (channels_last 4-D input, and
// any input with L == 1 such as (N, C)). Per-channel tensors (weight, bias, running statistics) are
// (C,) in x's dtype or in the compute dtype (float32 for fp16/bf16/fp32 x, float64 for float64 x),
// as a model under autocast keeps them; mean and invstd are returned and taken in the compute dtype.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <fastops/checks.h>

#include <cstdint>
#include <optional>
#include <string>

namespace fastops {

struct BatchNormShape {
  int64_t N, C, L;                         // L: elements per (n, c): the product of the dims after the channels
  bool rows;                               // memory is N * L rows of C channels (else N * C planes of L elements)
  int64_t count() const { return N * L; }  // elements per channel
};

inline at::ScalarType bn_compute_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_bn_input(const char* op, const char* arg, const at::Tensor& x) {
  check_floating(op, arg, x);
  FASTOPS_CHECK_SHAPE(x.dim() >= 2 && x.size(1) > 0, "fastops.", op, ": expected ", arg,
                      " to have at least 2 dims (N, C, ...) and at least one channel, got shape ", str(x.sizes()));
}

// weight, bias, running_mean, running_var: (C,) on x's device, in x's dtype or the compute dtype.
inline void check_bn_per_channel(const char* op, const char* arg, const std::optional<at::Tensor>& t,
                                 const at::Tensor& x) {
  if (!t.has_value() || !t->defined()) return;
  check_same_device(op, arg, *t, "x", x);
  const auto dtype = t->scalar_type();
  const std::string allowed = x.scalar_type() == bn_compute_dtype(x)
                                  ? str(x.scalar_type())
                                  : str(x.scalar_type()) + " or " + str(bn_compute_dtype(x));
  FASTOPS_CHECK_DTYPE(dtype == x.scalar_type() || dtype == bn_compute_dtype(x), "fastops.", op, ": expected ", arg,
                      " to be ", std::string(allowed), " (x is ", str(x.scalar_type()), "), got ", str(dtype));
  FASTOPS_CHECK_SHAPE(t->dim() == 1 && t->size(0) == x.size(1), "fastops.", op, ": expected ", arg, " of shape [",
                      str(x.size(1)), "] (one value per channel of x), got ", str(t->sizes()));
}

// mean and invstd of the backward: (C,) in the compute dtype, as the forward returned them.
inline void check_bn_statistic(const char* op, const char* arg, const at::Tensor& t, const at::Tensor& x) {
  check_same_device(op, arg, t, "x", x);
  const bool dtype_ok = t.scalar_type() == bn_compute_dtype(x);
  const bool shape_ok = t.dim() == 1 && t.size(0) == x.size(1);
  if (C10_UNLIKELY(!dtype_ok || !shape_ok)) {
    const std::string message = c10::str("fastops.", op, ": expected ", arg, " to be a ", str(bn_compute_dtype(x)),
                                         " tensor of shape [", str(x.size(1)), "] (as batch_norm returns it), got ",
                                         str(t.scalar_type()), " of shape ", str(t.sizes()));
    throw_error(dtype_ok ? ErrorType::kShape : ErrorType::kDtype, message);
  }
}

// Every check of the forward op, in the order the Python function made them.
inline void check_bn_forward(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                             const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                             const std::optional<at::Tensor>& running_var, bool training, double eps) {
  check_bn_input(op, "x", x);
  check_bn_per_channel(op, "weight", weight, x);
  check_bn_per_channel(op, "bias", bias, x);
  check_bn_per_channel(op, "running_mean", running_mean, x);
  check_bn_per_channel(op, "running_var", running_var, x);
  check_positive_fits_compute_type(op, "eps", eps, x);
  const bool has_mean = running_mean.has_value() && running_mean->defined();
  const bool has_var = running_var.has_value() && running_var->defined();
  // As F.batch_norm: one statistic without the other would be updated alone.
  FASTOPS_CHECK_ARG(has_mean == has_var, "fastops.", op, ": expected running_mean and running_var both or neither, ",
                    "got only ", has_mean ? "running_mean" : "running_var");
  if (training) {
    // The unbiased variance (for the running statistics) divides by count - 1.
    FASTOPS_CHECK_ARG(x.numel() == 0 || x.numel() / x.size(1) > 1, "fastops.", op,
                      ": expected more than 1 value per channel when training, got x of shape ", str(x.sizes()));
  } else {
    FASTOPS_CHECK_ARG(has_mean && has_var, "fastops.", op,
                      ": expected running_mean and running_var when training=False (eval mode)");
  }
}

// Every check of the backward op.
inline void check_bn_backward(const char* op, const at::Tensor& grad_out, const at::Tensor& x,
                              const std::optional<at::Tensor>& weight, const at::Tensor& mean,
                              const at::Tensor& invstd) {
  check_bn_input(op, "x", x);
  check_same_device(op, "grad_out", grad_out, "x", x);
  check_same_dtype(op, "grad_out", grad_out, "x", x);
  check_same_shape(op, "grad_out", grad_out, "x", x);
  check_bn_per_channel(op, "weight", weight, x);
  check_bn_statistic(op, "mean", mean, x);
  check_bn_statistic(op, "invstd", invstd, x);
}

// The elements per (n, c): the product of the dims after the channels.
inline int64_t bn_plane_size(const at::Tensor& x) {
  int64_t L = 1;
  for (int64_t d = 2; d < x.dim(); ++d) L *= x.size(d);
  return L;
}

// The rows layout: channels_last 4-D input (the rule of checks.h), or nothing after the channels.
inline bool bn_rows(const at::Tensor& x) { return use_channels_last(x) || bn_plane_size(x) == 1; }

// t in the memory layout the kernels run in (a no-op when it already is).
inline at::Tensor bn_layout(const at::Tensor& t, bool rows) {
  return use_channels_last(t) && rows ? t : t.contiguous();
}

inline BatchNormShape bn_shape(const at::Tensor& x, bool rows) {
  return {x.size(0), x.size(1), bn_plane_size(x), rows};
}

}  // namespace fastops
