// Input checks shared by every op. Each message names the op and the argument, and says what was
// expected, so a user can fix the call without reading our source.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace fastops {

// Message pieces are formatted here, never by streaming numbers, shapes or devices into
// TORCH_CHECK: on some toolchains (seen on the GPU image: libstdc++ pieces linked into the
// extension) iostream's numeric formatting inside an extension crashes. Strings alone are safe.
inline std::string str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}
inline std::string str(int64_t v) { return std::to_string(v); }
inline std::string str(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}
inline std::string str(const at::Device& d) { return d.str(); }
inline std::string str(at::ScalarType t) { return c10::toString(t); }

// Floating dtypes every op accepts; fp64 is accepted on the CPU (gradcheck needs it).
inline void check_floating(const char* op, const char* arg, const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  const bool ok = dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 ||
                  (dtype == at::kDouble && t.device().is_cpu());
  TORCH_CHECK(ok, "fastops.", op, ": expected ", arg, " to be a float32, float16 or bfloat16 tensor",
              t.device().is_cpu() ? " (or float64 on the CPU)" : "", ", got ", str(dtype), " on ", str(t.device()));
}

inline void check_same_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                              const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), "fastops.", op, ": expected ", arg, " on the same device as ", ref_arg, " (",
              str(ref.device()), "), got ", str(t.device()));
}

inline void check_same_dtype(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                             const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "fastops.", op, ": expected ", arg, " to have the dtype of ",
              ref_arg, " (", str(ref.scalar_type()), "), got ", str(t.scalar_type()));
}

inline void check_same_shape(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                             const at::Tensor& ref) {
  TORCH_CHECK(t.sizes() == ref.sizes(), "fastops.", op, ": expected ", arg, " to have the shape of ", ref_arg, " ",
              str(ref.sizes()), ", got ", str(t.sizes()));
}

inline void check_positive_finite(const char* op, const char* arg, double value) {
  TORCH_CHECK(std::isfinite(value) && value > 0.0, "fastops.", op, ": expected ", arg,
              " to be a finite number > 0, got ", str(value));
}

// A finite, positive value that stays so in the type a kernel computes in for input `x` (float64 for
// float64 input, float32 otherwise): eps=1e39 would become +inf in float32, silently changing every
// output. The Python face checks the same range; this guards direct torch.ops.fastops calls.
inline void check_positive_fits_compute_type(const char* op, const char* arg, double value, const at::Tensor& x) {
  check_positive_finite(op, arg, value);
  const bool fp64 = x.scalar_type() == at::kDouble;
  const double lo = fp64 ? std::numeric_limits<double>::denorm_min() : std::numeric_limits<float>::denorm_min();
  const double hi = fp64 ? std::numeric_limits<double>::max() : std::numeric_limits<float>::max();
  TORCH_CHECK(value >= lo && value <= hi, "fastops.", op, ": ", arg, "=", str(value), " does not fit ",
              fp64 ? "float64" : "float32", " (the type ", op, " computes in for ", str(x.scalar_type()),
              " input): expected ", str(lo), " <= ", arg, " <= ", str(hi));
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

// The layout rule of the 4-D kernels (depthwise_conv2d, squeeze_excite) and of their fake kernels
// (fastops/ops/_validate.py: uses_channels_last): the channels_last kernel runs when the input is
// channels_last-contiguous and not also plain contiguous; everything else runs the NCHW kernel
// (after .contiguous() where needed). Outputs are written in the layout the kernel ran in.
inline bool use_channels_last(const at::Tensor& x) {
  return x.dim() == 4 && !x.is_contiguous() && x.is_contiguous(at::MemoryFormat::ChannelsLast);
}

}  // namespace fastops
