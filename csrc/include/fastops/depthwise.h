// Shape and argument checks of depthwise_conv2d, shared by the CPU and CUDA kernels (host code only,
// no ATen beyond Tensor.h, so .cu files can include it).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <fastops/checks.h>

#include <cstdint>
#include <optional>
#include <string>

namespace fastops {

// Everything a depthwise kernel needs to know about one call. Padding is per side (top/bottom,
// left/right) so padding="same" with an even effective kernel (extra zero on the bottom/right, as
// F.conv2d pads it) needs no special case: only the begin pads move the window, the end pads only
// set the output size.
struct DepthwiseGeometry {
  int64_t N, C, H, W;  // input
  int64_t KH, KW;      // kernel
  int64_t OH, OW;      // output
  int64_t sh, sw, pt, pb, pl, pr, dh, dw;
  int64_t taps() const { return KH * KW; }
};

// The hyper-parameters as the op takes them (the Python function parses ints, pairs and "same" into
// these lists; a direct torch.ops call is checked here).
inline void check_depthwise_args(const char* op, at::IntArrayRef stride, at::IntArrayRef padding,
                                 at::IntArrayRef dilation) {
  FASTOPS_CHECK_ARG(stride.size() == 2 && stride[0] >= 1 && stride[1] >= 1, "fastops.", op,
                    ": expected stride to be 2 integers >= 1, got ", str(stride));
  FASTOPS_CHECK_ARG(dilation.size() == 2 && dilation[0] >= 1 && dilation[1] >= 1, "fastops.", op,
                    ": expected dilation to be 2 integers >= 1, got ", str(dilation));
  FASTOPS_CHECK_ARG(padding.size() == 4 && padding[0] >= 0 && padding[1] >= 0 && padding[2] >= 0 && padding[3] >= 0,
                    "fastops.", op, ": expected padding to be 4 integers >= 0 (top, bottom, left, right), got ",
                    str(padding));
}

// Geometry from the input's (N, C, H, W), the kernel's (kh, kw) and the arguments; checks that the
// padded input holds at least one window, as F.conv2d does (a RuntimeError, as F.conv2d raises it).
inline DepthwiseGeometry make_depthwise_geometry(const char* op, at::IntArrayRef input_size, int64_t kh, int64_t kw,
                                                 at::IntArrayRef stride, at::IntArrayRef padding,
                                                 at::IntArrayRef dilation) {
  FASTOPS_CHECK_SHAPE(input_size.size() == 4, "fastops.", op, ": expected a 4-D input (N, C, H, W), got sizes ",
                      str(input_size));
  FASTOPS_CHECK_SHAPE(kh >= 1 && kw >= 1, "fastops.", op, ": expected a kernel of at least 1 x 1");
  check_depthwise_args(op, stride, padding, dilation);
  DepthwiseGeometry g{};
  g.N = input_size[0];
  g.C = input_size[1];
  g.H = input_size[2];
  g.W = input_size[3];
  g.KH = kh;
  g.KW = kw;
  g.sh = stride[0];
  g.sw = stride[1];
  g.pt = padding[0];
  g.pb = padding[1];
  g.pl = padding[2];
  g.pr = padding[3];
  g.dh = dilation[0];
  g.dw = dilation[1];
  const int64_t span_h = g.dh * (kh - 1) + 1, span_w = g.dw * (kw - 1) + 1;
  const int64_t hp = g.H + g.pt + g.pb, wp = g.W + g.pl + g.pr;
  TORCH_CHECK(hp >= span_h && wp >= span_w, "fastops.", op, ": the padded input (", str(hp), " x ", str(wp),
              ") is smaller than the dilated kernel (", str(span_h), " x ", str(span_w), ")");
  g.OH = (hp - span_h) / g.sh + 1;
  g.OW = (wp - span_w) / g.sw + 1;
  return g;
}

// A depthwise weight (C, 1, kh, kw) for `channels` channels, kh and kw >= 1 (the fake kernel in
// fastops/ops/depthwise_conv2d.py checks the same).
inline void check_depthwise_weight(const char* op, const at::Tensor& weight, int64_t channels) {
  FASTOPS_CHECK_SHAPE(weight.dim() == 4 && weight.size(1) == 1, "fastops.", op,
                      ": expected weight of shape (C, 1, kh, kw) (channel multiplier 1), got ",
                      str(as_tuple(weight.sizes())));
  FASTOPS_CHECK_SHAPE(weight.size(2) >= 1 && weight.size(3) >= 1, "fastops.", op,
                      ": expected a kernel of at least 1 x 1, got weight of shape ", str(as_tuple(weight.sizes())));
  FASTOPS_CHECK_SHAPE(weight.size(0) == channels, "fastops.", op, ": expected weight.size(0) == channels of x (",
                      str(channels), "), got weight of shape ", str(as_tuple(weight.sizes())),
                      " (a channel multiplier > 1 is not supported)");
}

inline void check_grad_out_shape(const char* op, const at::Tensor& grad, const DepthwiseGeometry& g) {
  FASTOPS_CHECK_SHAPE(
      grad.dim() == 4 && grad.size(0) == g.N && grad.size(1) == g.C && grad.size(2) == g.OH && grad.size(3) == g.OW,
      "fastops.", op, ": expected grad_out of shape ", str(at::IntArrayRef({g.N, g.C, g.OH, g.OW})), ", got ",
      str(grad.sizes()));
}

// The forward's checks on x, weight and bias (what F.conv2d(groups=C) would reject, in our words):
// shapes, then devices, then dtypes. Under autocast the autocast kernel has cast them already.
inline void check_depthwise_inputs(const at::Tensor& x, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias) {
  const char* op = "depthwise_conv2d";
  const bool has_bias = bias.has_value() && bias->defined();
  FASTOPS_CHECK_SHAPE(x.dim() == 4, "fastops.", op, ": expected x to be 4-D (N, C, H, W), got shape ",
                      str(as_tuple(x.sizes())));
  check_depthwise_weight(op, weight, x.size(1));
  if (has_bias) {
    FASTOPS_CHECK_SHAPE(bias->dim() == 1 && bias->size(0) == x.size(1), "fastops.", op, ": expected bias of shape (",
                        str(x.size(1)), ",), got ", str(as_tuple(bias->sizes())));
  }
  check_same_device(op, "weight", weight, "x", x);
  if (has_bias) check_same_device(op, "bias", *bias, "x", x);
  check_floating(op, "x", x);
  check_same_dtype(op, "weight", weight, "x", x);
  if (has_bias) check_same_dtype(op, "bias", *bias, "x", x);
}

inline DepthwiseGeometry check_depthwise_backward_input(const at::Tensor& grad, const at::Tensor& weight,
                                                        at::IntArrayRef input_size, at::IntArrayRef stride,
                                                        at::IntArrayRef padding, at::IntArrayRef dilation) {
  const char* op = "depthwise_conv2d_backward_input";
  check_floating(op, "grad_out", grad);
  check_same_device(op, "weight", weight, "grad_out", grad);
  check_same_dtype(op, "weight", weight, "grad_out", grad);
  FASTOPS_CHECK_SHAPE(weight.dim() == 4, "fastops.", op, ": expected weight of shape (C, 1, kh, kw), got ",
                      str(as_tuple(weight.sizes())));
  const DepthwiseGeometry g =
      make_depthwise_geometry(op, input_size, weight.size(2), weight.size(3), stride, padding, dilation);
  check_depthwise_weight(op, weight, g.C);
  check_grad_out_shape(op, grad, g);
  return g;
}

inline DepthwiseGeometry check_depthwise_backward_weight(const at::Tensor& grad, const at::Tensor& x,
                                                         at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                                         at::IntArrayRef padding, at::IntArrayRef dilation) {
  const char* op = "depthwise_conv2d_backward_weight";
  check_floating(op, "x", x);
  check_same_device(op, "grad_out", grad, "x", x);
  check_same_dtype(op, "grad_out", grad, "x", x);
  FASTOPS_CHECK_SHAPE(x.dim() == 4, "fastops.", op, ": expected x to be 4-D, got shape ", str(as_tuple(x.sizes())));
  FASTOPS_CHECK_ARG(kernel_size.size() == 2, "fastops.", op, ": expected kernel_size to be 2 integers, got ",
                    str(kernel_size));
  const DepthwiseGeometry g =
      make_depthwise_geometry(op, x.sizes(), kernel_size[0], kernel_size[1], stride, padding, dilation);
  check_grad_out_shape(op, grad, g);
  return g;
}

}  // namespace fastops
