// Shape and argument checks of depthwise_conv2d, shared by the CPU and CUDA kernels (host code only,
// no ATen beyond Tensor.h, so .cu files can include it).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <fastops/checks.h>

#include <cstdint>
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

inline void check_depthwise_args(const char* op, at::IntArrayRef stride, at::IntArrayRef padding,
                                 at::IntArrayRef dilation) {
  TORCH_CHECK(stride.size() == 2 && stride[0] >= 1 && stride[1] >= 1, "fastops.", op,
              ": expected stride to be 2 integers >= 1, got ", str(stride));
  TORCH_CHECK(dilation.size() == 2 && dilation[0] >= 1 && dilation[1] >= 1, "fastops.", op,
              ": expected dilation to be 2 integers >= 1, got ", str(dilation));
  TORCH_CHECK(padding.size() == 4 && padding[0] >= 0 && padding[1] >= 0 && padding[2] >= 0 && padding[3] >= 0,
              "fastops.", op, ": expected padding to be 4 integers >= 0 (top, bottom, left, right), got ",
              str(padding));
}

// Geometry from the input's (N, C, H, W), the kernel's (kh, kw) and the arguments; checks that the
// padded input holds at least one window, as F.conv2d does.
inline DepthwiseGeometry make_depthwise_geometry(const char* op, at::IntArrayRef input_size, int64_t kh, int64_t kw,
                                                 at::IntArrayRef stride, at::IntArrayRef padding,
                                                 at::IntArrayRef dilation) {
  check_depthwise_args(op, stride, padding, dilation);
  TORCH_CHECK(input_size.size() == 4, "fastops.", op, ": expected a 4-D input (N, C, H, W), got sizes ",
              str(input_size));
  TORCH_CHECK(kh >= 1 && kw >= 1, "fastops.", op, ": expected a kernel of at least 1x1");
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

// The layout rule every kernel and the fake kernels share: the channels_last kernel runs when the
// input is channels_last-contiguous and not also plain contiguous; everything else runs the NCHW
// kernel (after .contiguous() where needed). Outputs are written in the layout the kernel ran in.
inline bool use_channels_last(const at::Tensor& x) {
  return x.dim() == 4 && !x.is_contiguous() && x.is_contiguous(at::MemoryFormat::ChannelsLast);
}

inline void check_depthwise_weight(const char* op, const at::Tensor& weight, int64_t channels) {
  TORCH_CHECK(weight.dim() == 4 && weight.size(1) == 1, "fastops.", op,
              ": expected weight of shape (C, 1, kh, kw) (channel multiplier 1), got ", str(weight.sizes()));
  TORCH_CHECK(weight.size(0) == channels, "fastops.", op, ": expected weight.size(0) == channels of x (", str(channels),
              "), got weight of shape ", str(weight.sizes()));
}

}  // namespace fastops
