// Input checks shared by every op. Each message names the op and the argument, and says what was
// expected, so a user can fix the call without reading our source. These checks are the one source
// of the ops' error text: the Python functions (fastops/ops/) only check what the schema cannot
// take (a non-Tensor argument, a non-number eps) and parse hyper-parameters; their fake kernels
// check what shape inference needs.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

namespace fastops {

// The Python type a failed check raises, as the Python functions raised them before the checks moved
// here (fastops/ops/_validate.py defines the types and registers them at import):
//   kShape    ShapeError(ValueError, RuntimeError): a tensor of a shape the op does not take
//   kDtype    DtypeError(TypeError, NotImplementedError): a tensor of a dtype the op does not take
//   kArgument ArgumentError(ValueError, RuntimeError): an argument value the op does not take
// A device mismatch stays a TORCH_CHECK: a RuntimeError, as PyTorch raises it.
enum class ErrorType { kShape = 0, kDtype = 1, kArgument = 2 };

// Throws the typed error (a torch::PyTorchError, translated to the registered Python type wherever
// PyTorch turns a C++ exception into a Python one). Defined out of line in csrc/errors.cpp, the one
// file that includes Python's headers for it, so .cu files can call it.
[[noreturn]] void throw_error(ErrorType type, const std::string& message);

}  // namespace fastops

// Used as TORCH_CHECK is: the condition, then the pieces of the message, each a string (see str()
// below), never a number.
#define FASTOPS_CHECK_SHAPE(cond, ...)                                                                        \
  do {                                                                                                        \
    if (C10_UNLIKELY(!(cond))) ::fastops::throw_error(::fastops::ErrorType::kShape, ::c10::str(__VA_ARGS__)); \
  } while (false)
#define FASTOPS_CHECK_DTYPE(cond, ...)                                                                        \
  do {                                                                                                        \
    if (C10_UNLIKELY(!(cond))) ::fastops::throw_error(::fastops::ErrorType::kDtype, ::c10::str(__VA_ARGS__)); \
  } while (false)
#define FASTOPS_CHECK_ARG(cond, ...)                                                                             \
  do {                                                                                                           \
    if (C10_UNLIKELY(!(cond))) ::fastops::throw_error(::fastops::ErrorType::kArgument, ::c10::str(__VA_ARGS__)); \
  } while (false)

namespace fastops {

// Message pieces are formatted here, never by streaming numbers, shapes or devices into
// TORCH_CHECK: on some toolchains (seen on the GPU image: libstdc++ pieces linked into the
// extension) iostream's numeric formatting inside an extension crashes. Strings alone are safe.
// Values read as Python writes them, since these are the messages of the Python functions too.

// A double as Python's repr() writes it: the shortest digits that read back as the same value;
// positional for exponents -4..15, else scientific with at least two exponent digits (1e-06, 1e+39).
inline std::string str(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  for (int precision = 0; precision < 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  const std::string s(buf);  // [-]d[.ddd]e[+-]xx
  const size_t e = s.find('e');
  const std::string sign = s[0] == '-' ? "-" : "";
  std::string digits;
  for (size_t i = sign.size(); i < e; ++i) {
    if (s[i] != '.') digits += s[i];
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int exp = std::atoi(s.c_str() + e + 1);
  if (exp < -4 || exp >= 16) {
    char tail[16];
    std::snprintf(tail, sizeof(tail), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return sign + digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "") + tail;
  }
  if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const size_t whole = static_cast<size_t>(exp) + 1;
  if (digits.size() <= whole) return sign + digits + std::string(whole - digits.size(), '0') + ".0";
  return sign + digits.substr(0, whole) + "." + digits.substr(whole);
}
// With `significant` digits, as Python's f"{v:.3g}" (significant = 3).
inline std::string str(double v, int significant) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.*g", significant, v);
  return buf;
}
inline std::string str(int64_t v) { return std::to_string(v); }
// Sizes as a Python list, [2, 3]; str(as_tuple(sizes)) as a tuple, (2, 3) or (3,).
inline std::string str(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}
struct TupleOf {
  at::IntArrayRef sizes;
};
inline TupleOf as_tuple(at::IntArrayRef sizes) { return {sizes}; }
inline std::string str(TupleOf t) {
  std::string s = "(";
  for (size_t i = 0; i < t.sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(t.sizes[i]);
  return s + (t.sizes.size() == 1 ? ",)" : ")");
}
inline std::string str(const at::Device& d) { return d.str(); }
// A dtype as Python names it: torch.float32, torch.bfloat16, torch.int64, torch.complex64 (c10's name
// in lower case, where Python does not rename it).
inline std::string str(at::ScalarType t) {
  static constexpr std::pair<at::ScalarType, const char*> renamed[] = {{at::kFloat, "float32"},
                                                                       {at::kDouble, "float64"},
                                                                       {at::kHalf, "float16"},
                                                                       {at::kByte, "uint8"},
                                                                       {at::kChar, "int8"},
                                                                       {at::kShort, "int16"},
                                                                       {at::kInt, "int32"},
                                                                       {at::kLong, "int64"},
                                                                       {at::kComplexHalf, "complex32"},
                                                                       {at::kComplexFloat, "complex64"},
                                                                       {at::kComplexDouble, "complex128"}};
  for (const auto& [type, name] : renamed) {
    if (type == t) return std::string("torch.") + name;
  }
  std::string name = std::string("torch.") + c10::toString(t);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// Floating dtypes every op accepts; fp64 is accepted on the CPU (gradcheck needs it).
inline void check_floating(const char* op, const char* arg, const at::Tensor& t) {
  const auto dtype = t.scalar_type();
  const bool ok = dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16 ||
                  (dtype == at::kDouble && t.device().is_cpu());
  FASTOPS_CHECK_DTYPE(ok, "fastops.", op, ": expected ", arg, " to be a float32, float16 or bfloat16 tensor",
                      t.device().is_cpu() ? " (or float64 on the CPU)" : "", ", got ", str(dtype), " on ",
                      str(t.device()));
}

inline void check_same_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                              const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), "fastops.", op, ": expected ", arg, " on the same device as ", ref_arg, " (",
              str(ref.device()), "), got ", str(t.device()));
}

inline void check_same_dtype(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                             const at::Tensor& ref) {
  FASTOPS_CHECK_DTYPE(t.scalar_type() == ref.scalar_type(), "fastops.", op, ": expected ", arg,
                      " to have the dtype of ", ref_arg, " (", str(ref.scalar_type()), "), got ", str(t.scalar_type()));
}

inline void check_same_shape(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                             const at::Tensor& ref) {
  FASTOPS_CHECK_SHAPE(t.sizes() == ref.sizes(), "fastops.", op, ": expected ", arg, " to have the shape of ", ref_arg,
                      " ", str(ref.sizes()), ", got ", str(t.sizes()));
}

inline void check_positive_finite(const char* op, const char* arg, double value) {
  FASTOPS_CHECK_ARG(std::isfinite(value) && value > 0.0, "fastops.", op, ": expected ", arg,
                    " to be a finite number > 0, got ", str(value));
}

// A finite, positive value that stays so in the type a kernel computes in for input `x` (float64 for
// float64 input, float32 otherwise): eps=1e39 would become +inf in float32, silently changing every
// output, and eps=1e-46 would become 0.
inline void check_positive_fits_compute_type(const char* op, const char* arg, double value, const at::Tensor& x) {
  check_positive_finite(op, arg, value);
  const bool fp64 = x.scalar_type() == at::kDouble;
  const double lo = fp64 ? std::numeric_limits<double>::denorm_min() : std::numeric_limits<float>::denorm_min();
  const double hi = fp64 ? std::numeric_limits<double>::max() : std::numeric_limits<float>::max();
  FASTOPS_CHECK_ARG(value >= lo && value <= hi, "fastops.", op, ": ", arg, "=", str(value), " does not fit ",
                    fp64 ? "torch.float64" : "torch.float32", " (the type ", op, " computes in for ",
                    str(x.scalar_type()), " input): expected ", str(lo, 3), " <= ", arg, " <= ", str(hi, 3));
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
