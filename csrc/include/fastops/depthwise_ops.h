// depthwise_conv2d's ops as typed dispatcher handles, for the C++ that calls them through the
// dispatcher (so that each device's kernel runs): depthwise_conv2d's own Autograd kernel
// (csrc/depthwise_conv2d_op.cpp), and depthwise_separable_conv2d's, whose backward recomputes the
// depthwise output and takes the depthwise gradients from these ops (csrc/depthwise_separable_conv2d_op.cpp).
// Looked up once: handles<DepthwiseOps>().forward.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymIntArrayRef.h>
#include <fastops/op_handle.h>

#include <optional>
#include <tuple>

namespace fastops {

struct DepthwiseOps {
  using ForwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
                                at::IntArrayRef, at::IntArrayRef);
  using BackwardInputSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::SymIntArrayRef, at::IntArrayRef,
                                      at::IntArrayRef, at::IntArrayRef, bool);
  using BackwardWeightSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, at::IntArrayRef,
                                                               at::IntArrayRef, at::IntArrayRef, at::IntArrayRef);

  c10::TypedOperatorHandle<ForwardSig> forward = find_op<ForwardSig>("fastops::depthwise_conv2d");
  c10::TypedOperatorHandle<BackwardInputSig> backward_input =
      find_op<BackwardInputSig>("fastops::depthwise_conv2d_backward_input");
  c10::TypedOperatorHandle<BackwardWeightSig> backward_weight =
      find_op<BackwardWeightSig>("fastops::depthwise_conv2d_backward_weight");
};

}  // namespace fastops
