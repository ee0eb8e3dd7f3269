// depthwise_conv2d on the CPU: forward, input gradient, weight + bias gradient; NCHW and NHWC.
//   forward:  y[n,c,oh,ow] = b[c] + sum_{kh,kw} w[c,kh,kw] * x[n,c, oh*sh + kh*dh - pt, ow*sw + kw*dw - pl]
//   dgrad:    dx[n,c,ih,iw] = sum over (kh,kw,oh,ow) hitting (ih,iw) of w[c,kh,kw] * g[n,c,oh,ow]
//   wgrad:    dw[c,kh,kw] = sum_{n,oh,ow} g * x[...];  db[c] = sum_{n,oh,ow} g
// Math in fp32 for fp16/bf16/fp32 (fp64 for fp64 inputs); weights are converted once to that type.
//
// This file holds the entry points: argument checks, the layout choice (use_channels_last), the
// weights in opmath and the dtype dispatch. The kernels live one layout a file:
// depthwise_conv2d_nchw.cpp (phase planes and flat gathers, one (n, c) plane per task; its fp32 paths
// for particular maps in depthwise_conv2d_nchw_<path>.cpp) and
// depthwise_conv2d_nhwc.cpp (channel vectors, one row per task). Both leave the weight gradient as
// partial sums over a partition fixed by the shape, which sum_rows_in_order adds in order: the
// weight gradient is bitwise repeatable whatever the thread count.
//
// Bytes per call (minimal): forward reads x and writes y (2 * N*C*H*W * itemsize for stride 1);
// dgrad reads g and writes dx; wgrad reads x and g. FLOPs: 2 * N*C*OH*OW*kh*kw each.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <fastops/checks.h>
#include <fastops/cpu_reduce.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>
#include <fastops/depthwise_cpu.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

constexpr const char* kOp = "depthwise_conv2d";

template <typename T>
DepthwiseLayoutKernels<T> layout_kernels(bool channels_last) {
  return channels_last ? nhwc_kernels<T>() : nchw_kernels<T>();
}

}  // namespace

at::Tensor depthwise_conv2d(const at::Tensor& x_in, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  check_depthwise_inputs(x_in, weight, bias);
  const DepthwiseGeometry g =
      make_depthwise_geometry(kOp, x_in.sizes(), weight.size(2), weight.size(3), stride, padding, dilation);
  const bool cl = use_channels_last(x_in);
  const auto fmt = cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor x = x_in.contiguous(fmt);
  at::Tensor y = at::empty({g.N, g.C, g.OH, g.OW}, x.options().memory_format(fmt));
  if (y.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_depthwise_conv2d_cpu", [&] {
    const auto acc = c10::CppTypeToScalarType<opmath_t<scalar_t>>::value;
    constexpr int64_t L = opmath_vec_size<scalar_t>();
    const at::Tensor w = weights_acc(weight, acc, cl, L);
    const at::Tensor b = bias_acc(bias, acc, L);
    layout_kernels<scalar_t>(cl).forward(x, w, b, y, g);
  });
  return y;
}

at::Tensor depthwise_conv2d_backward_input(const at::Tensor& grad_in, const at::Tensor& weight,
                                           c10::SymIntArrayRef input_size_sym, at::IntArrayRef stride,
                                           at::IntArrayRef padding, at::IntArrayRef dilation, bool channels_last) {
  const at::IntArrayRef input_size = C10_AS_INTARRAYREF_SLOW(input_size_sym);
  const DepthwiseGeometry g = check_depthwise_backward_input(grad_in, weight, input_size, stride, padding, dilation);
  const auto fmt = channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor go = grad_in.contiguous(fmt);
  at::Tensor dx = at::empty(input_size, go.options().memory_format(fmt));
  if (dx.numel() == 0) return dx;
  if (go.numel() == 0) return dx.zero_();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, go.scalar_type(), "fastops_depthwise_dgrad_cpu", [&] {
    const auto acc = c10::CppTypeToScalarType<opmath_t<scalar_t>>::value;
    const at::Tensor w = weights_acc(weight, acc, channels_last, opmath_vec_size<scalar_t>());
    layout_kernels<scalar_t>(channels_last).backward_input(go, w, dx, g);
  });
  return dx;
}

std::tuple<at::Tensor, at::Tensor> depthwise_conv2d_backward_weight(const at::Tensor& grad_in, const at::Tensor& x_in,
                                                                    at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                                                    at::IntArrayRef padding, at::IntArrayRef dilation) {
  const DepthwiseGeometry g = check_depthwise_backward_weight(grad_in, x_in, kernel_size, stride, padding, dilation);
  const bool cl = use_channels_last(x_in);
  const auto fmt = cl ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor x = x_in.contiguous(fmt);
  const at::Tensor go = grad_in.contiguous(fmt);
  at::Tensor dw = at::empty({g.C, 1, g.KH, g.KW}, x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor db = at::empty({g.C}, x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t taps = g.taps();
  if (go.numel() == 0) {
    dw.zero_();
    db.zero_();
    return {dw, db};
  }
  at::Tensor partials;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_depthwise_wgrad_cpu",
                                  [&] { partials = layout_kernels<scalar_t>(cl).weight_partials(go, x, g); });
  const at::Tensor sums = sum_rows_in_order(partials);
  // (C, taps + 1): each channel's tap sums, then its bias sum. NHWC sums are (taps + 1, Cp).
  const at::Tensor per_channel = cl ? sums.narrow(1, 0, g.C).t() : sums;
  dw.view({g.C, taps}).copy_(per_channel.narrow(1, 0, taps));
  db.copy_(per_channel.select(1, taps));
  return {dw, db};
}

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
