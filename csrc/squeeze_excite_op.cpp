// squeeze_excite, the op: the schemas of the block and of its memory passes, the autograd of each
// pass (at the end of the file), and the whole SE block y = x * gate(fc2(act(fc1(mean_hw(x))))) as
// one op with its autograd in C++:
//   squeeze_excite           the block; its Autograd kernel (a torch::autograd::Function) calls
//   squeeze_excite_forward   y and the (N, C) / (N, R) intermediates, and its backward calls
//   squeeze_excite_backward  every gradient of the block.
// The fake kernels are in fastops/ops/squeeze_excite.py; no autocast rule (the block runs in the
// dtype of x, the FCs inside in float32).
// Device-neutral: the four memory passes (cpu/squeeze_excite.cpp, cuda/squeeze_excite.cu) are reached
// through the dispatcher, and the (N, C)-sized act and gate between them are ATen; the FCs are ATen
// GEMMs except for a small float32 batch on the AVX-512 CPU build (cpu::se_fc_*).
//   forward:  pooled = pool(x); hidden = fc1(pooled); activated = act(hidden);
//             pre_gate = fc2(activated); scale = gate(pre_gate); y = scale(x, scale)
//   backward: ds = reduce(g, x); dz = gate'(ds); dW2 = dz^T a; db2 = sum dz;
//             dh = act'(dz W2); dW1 = dh^T p; db1 = sum dh; dx = backward_input(g, s, dh W1)
// Why C++: the SE maps of MobileNetV3 cost 0.1-0.5 ms a call, and composed in Python the block made
// about 6 (forward) and 12 (backward) Python-to-C++ calls, each a few microseconds of dispatch, plus
// a Python autograd node; here a forward is one op call and the backward never enters Python. The
// steps run below autograd and outside autocast: the FCs run in the compute dtype (float32, float64
// for float64 x) whatever autocast says, and the block in the dtype of x (the final x * s). Numerics
// are those of the composed form step for step (the same ATen kernels in the same order), but for
// the summation order inside our FC kernels.
#include <ATen/TensorOperators.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/hardsigmoid.h>
#include <ATen/ops/hardsigmoid_backward.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sigmoid_backward.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/threshold_backward.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fastops/autograd.h>
#include <fastops/cpu_capability.h>
#include <fastops/op_handle.h>
#include <fastops/squeeze_excite.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

// The CPU kernels (cpu/squeeze_excite.cpp), one per ISA level; the running level's are registered below.
FASTOPS_DECLARE_CPU_KERNEL(squeeze_excite_pool, at::Tensor(const at::Tensor&))
FASTOPS_DECLARE_CPU_KERNEL(squeeze_excite_scale, at::Tensor(const at::Tensor&, const at::Tensor&))
FASTOPS_DECLARE_CPU_KERNEL(squeeze_excite_backward_reduce, at::Tensor(const at::Tensor&, const at::Tensor&))
FASTOPS_DECLARE_CPU_KERNEL(squeeze_excite_backward_input,
                           at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&))

TORCH_LIBRARY_FRAGMENT(fastops, m) {
  // squeeze_excite: the memory passes of an SE block x * gate(fc2(act(fc1(mean_hw(x))))); the FCs between
  // them run in ATen. Per-(n, c) tensors are (N, C) in float32
  // (float64 for float64 x). backward_input: grad_out * scale + grad_pool / HW.
  m.def("squeeze_excite_pool(Tensor x) -> Tensor");
  m.def("squeeze_excite_scale(Tensor x, Tensor scale) -> Tensor");
  m.def("squeeze_excite_backward_reduce(Tensor grad_out, Tensor x) -> Tensor");
  m.def("squeeze_excite_backward_input(Tensor grad_out, Tensor scale, Tensor grad_pool) -> Tensor");
  // The whole block, its autograd in C++ (below): squeeze_excite's backward is
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
}

namespace fastops {
namespace {

enum class SeAct { kRelu, kSilu, kGelu };
enum class SeGate { kSigmoid, kHardsigmoid };

SeAct parse_act(const char* op, std::string_view act) {
  if (act == "relu") return SeAct::kRelu;
  if (act == "silu") return SeAct::kSilu;
  if (act == "gelu") return SeAct::kGelu;
  FASTOPS_CHECK_ARG(false, "fastops.", op, ": expected act to be one of ['relu', 'silu', 'gelu'], got '",
                    std::string(act), "'");
  return SeAct::kRelu;  // not reached
}

SeGate parse_gate(const char* op, std::string_view gate) {
  if (gate == "sigmoid") return SeGate::kSigmoid;
  if (gate == "hardsigmoid") return SeGate::kHardsigmoid;
  FASTOPS_CHECK_ARG(false, "fastops.", op, ": expected gate to be one of ['sigmoid', 'hardsigmoid'], got '",
                    std::string(gate), "'");
  return SeGate::kSigmoid;  // not reached
}

// The block's steps run below the autograd keys and with autocast excluded (see the header).
struct BlockGuard {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  c10::impl::ExcludeDispatchKeyGuard no_autocast{c10::autocast_dispatch_keyset};
};

at::Tensor in_dtype(const at::Tensor& t, at::ScalarType dtype) { return t.scalar_type() == dtype ? t : t.to(dtype); }

// x W^T (+ b), as F.linear computes it for 2-D x: our FC kernel where se_fc_applies, else ATen.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  at::ScalarType dtype) {
  const bool has_bias = bias.has_value() && bias->defined();
  if (FASTOPS_CPU_KERNEL(se_fc_applies)(x)) {
    return FASTOPS_CPU_KERNEL(se_fc_forward)(x, in_dtype(weight, dtype),
                                             has_bias ? in_dtype(*bias, dtype) : at::Tensor());
  }
  const at::Tensor w = in_dtype(weight, dtype).t();
  if (has_bias) return at::addmm(in_dtype(*bias, dtype), x, w);
  return at::mm(x, w);
}

// The FC's backward without its bias: (input_grad ? grad W : undefined, grad^T x).
std::tuple<at::Tensor, at::Tensor> linear_backward(const at::Tensor& grad, const at::Tensor& x,
                                                   const at::Tensor& weight, at::ScalarType dtype, bool input_grad) {
  if (FASTOPS_CPU_KERNEL(se_fc_applies)(x))
    return FASTOPS_CPU_KERNEL(se_fc_backward)(grad, x, in_dtype(weight, dtype), input_grad);
  return {input_grad ? at::mm(grad, in_dtype(weight, dtype)) : at::Tensor(), at::mm(grad.t(), x)};
}

// The memory passes, through the dispatcher so each device's kernel runs; looked up once.
using UnarySig = at::Tensor(const at::Tensor&);
using BinarySig = at::Tensor(const at::Tensor&, const at::Tensor&);
using TernarySig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&);
struct Passes {
  c10::TypedOperatorHandle<UnarySig> pool = find_op<UnarySig>("fastops::squeeze_excite_pool");
  c10::TypedOperatorHandle<BinarySig> scale = find_op<BinarySig>("fastops::squeeze_excite_scale");
  c10::TypedOperatorHandle<BinarySig> reduce = find_op<BinarySig>("fastops::squeeze_excite_backward_reduce");
  c10::TypedOperatorHandle<TernarySig> input = find_op<TernarySig>("fastops::squeeze_excite_backward_input");
};

at::Tensor pool(const at::Tensor& x) { return handles<Passes>().pool.call(x); }

at::Tensor scale_pass(const at::Tensor& x, const at::Tensor& scale) { return handles<Passes>().scale.call(x, scale); }

at::Tensor reduce_pass(const at::Tensor& grad_out, const at::Tensor& x) {
  return handles<Passes>().reduce.call(grad_out, x);
}

at::Tensor input_pass(const at::Tensor& grad_out, const at::Tensor& scale, const at::Tensor& grad_pool) {
  return handles<Passes>().input.call(grad_out, scale, grad_pool);
}

// The raw ops take the FC operands and the saved intermediates from any caller; they are checked here,
// for every device and build, before ATen's GEMMs or our CPU FC kernels read them by these shapes.
void check_fc_operand(const char* op, const char* arg, const at::Tensor& t, at::IntArrayRef shape,
                      const at::Tensor& x) {
  FASTOPS_CHECK_DTYPE(t.is_floating_point(), "fastops.", op, ": expected ", arg, " to be a floating tensor, got ",
                      str(t.scalar_type()));
  check_same_device(op, arg, t, "x", x);
  FASTOPS_CHECK_SHAPE(t.sizes() == shape, "fastops.", op, ": expected ", arg, " of shape ", str(shape), ", got ",
                      str(t.sizes()));
}

// fc1_weight (R, C) and fc2_weight (C, R) for x's C; returns R.
int64_t check_fc_weights(const char* op, const at::Tensor& x, const at::Tensor& fc1_weight,
                         const at::Tensor& fc2_weight) {
  FASTOPS_CHECK_SHAPE(fc1_weight.dim() == 2, "fastops.", op,
                      ": expected fc1_weight to be 2-D (reduced_channels, C) as nn.Linear's weight (flatten a 1x1 "
                      "conv's weight), got shape ",
                      str(fc1_weight.sizes()));
  const int64_t C = x.size(1), R = fc1_weight.size(0);
  check_fc_operand(op, "fc1_weight", fc1_weight, {R, C}, x);
  check_fc_operand(op, "fc2_weight", fc2_weight, {C, R}, x);
  return R;
}

struct BlockForm {
  SeAct act;
  SeGate gate;
};

// Every check of the block's arguments, in the order of the Python function's old checks: x, the FC
// weights and biases, then act and gate. `op` names the op the caller called (squeeze_excite or
// squeeze_excite_forward).
BlockForm check_block(const char* op, const at::Tensor& x, const at::Tensor& fc1_weight,
                      const std::optional<at::Tensor>& fc1_bias, const at::Tensor& fc2_weight,
                      const std::optional<at::Tensor>& fc2_bias, c10::string_view act, c10::string_view gate) {
  check_se_activation(op, "x", x);
  const int64_t R = check_fc_weights(op, x, fc1_weight, fc2_weight);
  if (fc1_bias.has_value() && fc1_bias->defined()) check_fc_operand(op, "fc1_bias", *fc1_bias, {R}, x);
  if (fc2_bias.has_value() && fc2_bias->defined()) check_fc_operand(op, "fc2_bias", *fc2_bias, {x.size(1)}, x);
  return {parse_act(op, act), parse_gate(op, gate)};
}

// The block's forward after its checks (squeeze_excite_forward, and squeeze_excite below autograd).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> block_forward(
    const char* op, const at::Tensor& x, const at::Tensor& fc1_weight, const std::optional<at::Tensor>& fc1_bias,
    const at::Tensor& fc2_weight, const std::optional<at::Tensor>& fc2_bias, c10::string_view act_name,
    c10::string_view gate_name) {
  const BlockForm form = check_block(op, x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act_name, gate_name);
  BlockGuard guard;
  const at::ScalarType dtype = se_opmath_dtype(x);
  at::Tensor pooled = pool(x);
  at::Tensor hidden = linear(pooled, fc1_weight, fc1_bias, dtype);
  at::Tensor activated = form.act == SeAct::kRelu   ? at::relu(hidden)
                         : form.act == SeAct::kSilu ? at::silu(hidden)
                                                    : at::gelu(hidden);
  at::Tensor pre_gate = linear(activated, fc2_weight, fc2_bias, dtype);
  at::Tensor scale = form.gate == SeGate::kSigmoid ? at::sigmoid(pre_gate) : at::hardsigmoid(pre_gate);
  at::Tensor y = scale_pass(x, scale);
  return {y, pooled, hidden, activated, pre_gate, scale};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> squeeze_excite_forward(
    const at::Tensor& x, const at::Tensor& fc1_weight, const std::optional<at::Tensor>& fc1_bias,
    const at::Tensor& fc2_weight, const std::optional<at::Tensor>& fc2_bias, c10::string_view act,
    c10::string_view gate) {
  return block_forward("squeeze_excite_forward", x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act, gate);
}

// Every gradient of the block; grad_x only with input_grad (else an empty tensor), since it is the
// one full-size output. The parameter gradients are (N, C)-sized work and always computed; they come
// back in the compute dtype (the caller casts them to each parameter's dtype).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> squeeze_excite_backward(
    const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& fc1_weight, const at::Tensor& fc2_weight,
    const at::Tensor& pooled, const at::Tensor& hidden, const at::Tensor& activated, const at::Tensor& pre_gate,
    const at::Tensor& scale, c10::string_view act_name, c10::string_view gate_name, bool input_grad) {
  const char* op = "squeeze_excite_backward";
  const SeAct act = parse_act(op, act_name);
  const SeGate gate = parse_gate(op, gate_name);
  check_se_activation(op, "x", x);
  const int64_t R = check_fc_weights(op, x, fc1_weight, fc2_weight);
  check_se_per_channel(op, "pooled", pooled, "x", x);
  check_se_per_channel(op, "pre_gate", pre_gate, "x", x);
  check_se_per_channel(op, "scale", scale, "x", x);
  for (const auto& [arg, t] : {std::pair<const char*, const at::Tensor&>{"hidden", hidden}, {"activated", activated}}) {
    check_fc_operand(op, arg, t, {x.size(0), R}, x);
    FASTOPS_CHECK_DTYPE(t.scalar_type() == se_opmath_dtype(x), "fastops.", op, ": expected ", arg, " to be ",
                        str(se_opmath_dtype(x)), " (the compute dtype of x's ", str(x.scalar_type()), "), got ",
                        str(t.scalar_type()));
  }
  BlockGuard guard;
  const at::ScalarType dtype = se_opmath_dtype(x);
  const at::Tensor grad_scale = reduce_pass(grad_out, x);
  // aten's own backward kernels, the ones eager's autograd runs: sigmoid's from s = gate(z);
  // hardsigmoid's grad / 6 strictly inside (-3, 3); relu's selects (a NaN grad where h <= 0 gives 0).
  const at::Tensor grad_pre = gate == SeGate::kSigmoid ? at::sigmoid_backward(grad_scale, scale)
                                                       : at::hardsigmoid_backward(grad_scale, pre_gate);
  auto [grad_activated, grad_w2] = linear_backward(grad_pre, activated, fc2_weight, dtype, true);
  at::Tensor grad_b2 = grad_pre.sum(0);
  const at::Tensor grad_hidden = act == SeAct::kRelu   ? at::threshold_backward(grad_activated, hidden, 0)
                                 : act == SeAct::kSilu ? at::silu_backward(grad_activated, hidden)
                                                       : at::gelu_backward(grad_activated, hidden);
  auto [grad_pooled, grad_w1] = linear_backward(grad_hidden, pooled, fc1_weight, dtype, input_grad);
  at::Tensor grad_b1 = grad_hidden.sum(0);
  at::Tensor grad_x = input_grad ? input_pass(grad_out, scale, grad_pooled) : at::empty({0}, grad_out.options());
  return {grad_x, grad_w1, grad_b1, grad_w2, grad_b2};
}

using BlockOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

BlockOutputs forward_op(const at::Tensor& x, const at::Tensor& fc1_weight, const std::optional<at::Tensor>& fc1_bias,
                        const at::Tensor& fc2_weight, const std::optional<at::Tensor>& fc2_bias, c10::string_view act,
                        c10::string_view gate) {
  static const auto op =
      find_op<BlockOutputs(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,
                           const std::optional<at::Tensor>&, c10::string_view, c10::string_view)>(
          "fastops::squeeze_excite_forward");
  return op.call(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act, gate);
}

using BlockGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

BlockGrads backward_op(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& fc1_weight,
                       const at::Tensor& fc2_weight, const at::Tensor& pooled, const at::Tensor& hidden,
                       const at::Tensor& activated, const at::Tensor& pre_gate, const at::Tensor& scale,
                       c10::string_view act, c10::string_view gate, bool input_grad) {
  static const auto op =
      find_op<BlockGrads(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view,
                         c10::string_view, bool)>("fastops::squeeze_excite_backward");
  return op.call(grad_out, x, fc1_weight, fc2_weight, pooled, hidden, activated, pre_gate, scale, act, gate,
                 input_grad);
}

// A gradient in its parameter's dtype (the op computes in the compute dtype).
at::Tensor as_dtype_of(const at::Tensor& grad, int64_t dtype) {
  const auto target = static_cast<at::ScalarType>(dtype);
  return grad.scalar_type() == target ? grad : grad.to(target);
}

constexpr int64_t kNoBias = -1;

// The block's autograd. Saves x (as eager does), the two FC weights and the (N, C) / (N, R)
// intermediates; the backward is one op call. Differentiable once, like Python's
// @once_differentiable: a graph built through the backward (create_graph=True) raises when it is
// differentiated.
class SqueezeExciteFunction : public torch::autograd::Function<SqueezeExciteFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& fc1_weight,
                            const std::optional<at::Tensor>& fc1_bias, const at::Tensor& fc2_weight,
                            const std::optional<at::Tensor>& fc2_bias, c10::string_view act, c10::string_view gate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [y, pooled, hidden, activated, pre_gate, scale] =
        forward_op(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act, gate);
    ctx->save_for_backward({x, fc1_weight, fc2_weight, pooled, hidden, activated, pre_gate, scale});
    ctx->saved_data["act"] = std::string(act);
    ctx->saved_data["gate"] = std::string(gate);
    const auto bias_dtype = [](const std::optional<at::Tensor>& b) {
      return b.has_value() && b->defined() ? static_cast<int64_t>(b->scalar_type()) : kNoBias;
    };
    ctx->saved_data["fc1_bias_dtype"] = bias_dtype(fc1_bias);
    ctx->saved_data["fc2_bias_dtype"] = bias_dtype(fc2_bias);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &fc1_weight = saved[1], &fc2_weight = saved[2];
    const std::string act = ctx->saved_data["act"].toStringRef();
    const std::string gate = ctx->saved_data["gate"].toStringRef();
    const bool graph_through = at::GradMode::is_enabled() && grad_outputs[0].requires_grad();
    at::Tensor grad_x, grad_w1, grad_b1, grad_w2, grad_b2;
    {
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      at::NoGradGuard no_grad;
      std::tie(grad_x, grad_w1, grad_b1, grad_w2, grad_b2) =
          backward_op(grad_outputs[0], x, fc1_weight, fc2_weight, saved[3], saved[4], saved[5], saved[6], saved[7], act,
                      gate, ctx->needs_input_grad(0));
    }
    // One gradient per forward argument; needs_input_grad counts only the tensor arguments given
    // (an absent bias has no index).
    const int64_t b1_dtype = ctx->saved_data["fc1_bias_dtype"].toInt();
    const int64_t b2_dtype = ctx->saved_data["fc2_bias_dtype"].toInt();
    const bool has_b1 = b1_dtype != kNoBias, has_b2 = b2_dtype != kNoBias;
    const size_t w2_index = has_b1 ? 3 : 2;
    torch::autograd::variable_list grads(7);
    if (ctx->needs_input_grad(0)) grads[0] = grad_x;
    if (ctx->needs_input_grad(1)) grads[1] = as_dtype_of(grad_w1, static_cast<int64_t>(fc1_weight.scalar_type()));
    if (has_b1 && ctx->needs_input_grad(2)) grads[2] = as_dtype_of(grad_b1, b1_dtype);
    if (ctx->needs_input_grad(w2_index)) {
      grads[3] = as_dtype_of(grad_w2, static_cast<int64_t>(fc2_weight.scalar_type()));
    }
    if (has_b2 && ctx->needs_input_grad(w2_index + 1)) grads[4] = as_dtype_of(grad_b2, b2_dtype);
    if (graph_through) {
      // As @once_differentiable: the gradients carry a node that raises if they are differentiated.
      for (auto& grad : grads) {
        if (grad.defined()) grad = grad.detach().requires_grad_(true);
      }
      grads = torch::autograd::DelayedError(
                  "fastops.squeeze_excite: differentiable once; its backward cannot be differentiated again",
                  static_cast<int64_t>(grads.size()))
                  .apply(std::move(grads));
    }
    return grads;
  }
};

at::Tensor squeeze_excite_autograd(const at::Tensor& x, const at::Tensor& fc1_weight,
                                   const std::optional<at::Tensor>& fc1_bias, const at::Tensor& fc2_weight,
                                   const std::optional<at::Tensor>& fc2_bias, c10::string_view act,
                                   c10::string_view gate) {
  // Checked here, by the name the caller used, before the Function saves anything (its forward calls
  // squeeze_excite_forward, which checks again under its own name: a few comparisons). Not for the
  // tensors of torch.compile's tracing (fake and functional tensors, the Python key): their sizes may
  // be symbolic, and an error raised while tracing reaches the user as dynamo's TorchRuntimeError;
  // the compiled graph's own call raises the typed error instead.
  if (!x.key_set().has(c10::DispatchKey::Python)) {
    check_block("squeeze_excite", x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act, gate);
  }
  return SqueezeExciteFunction::apply(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act, gate);
}

// Below autograd (inference mode, or a caller that already is): the forward alone.
at::Tensor squeeze_excite_no_autograd(const at::Tensor& x, const at::Tensor& fc1_weight,
                                      const std::optional<at::Tensor>& fc1_bias, const at::Tensor& fc2_weight,
                                      const std::optional<at::Tensor>& fc2_bias, c10::string_view act,
                                      c10::string_view gate) {
  return std::get<0>(block_forward("squeeze_excite", x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act, gate));
}

// ---- the autograd of each pass (opcheck; a user composing the passes) --------------------------------
// pool(x) = sum_hw x / HW; scale(x, s) = x * s; reduce(g, x) = sum_hw g * x;
// backward_input(g, s, dp) = g * s + dp / HW. Each gradient is again one of the four passes (or, for
// the pool, a broadcast), called through autograd when the backward's graph is recorded, so the
// passes are differentiable any number of times.

class PoolFunction : public torch::autograd::Function<PoolFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->set_materialize_grads(false);
    ctx->saved_data["x_sizes"] = x.sym_sizes();  // x itself is not needed
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    return below_autograd(handles<Passes>().pool, x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor()};
    const std::vector<c10::SymInt> sizes = ctx->saved_data["x_sizes"].toSymIntVector();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    return {grads[0].div(c10::Scalar(sizes[2] * sizes[3])).to(dtype).unsqueeze(2).unsqueeze(3).expand_symint(sizes)};
  }
};

// scale, reduce and backward_input are linear in each input, and each input's gradient is one pass.
enum class Pass { kScale, kReduce, kInput };

template <Pass P>
class PassFunction : public torch::autograd::Function<PassFunction<P>> {
 public:
  static constexpr size_t kInputs = P == Pass::kInput ? 3 : 2;

  // The pass itself, below autograd.
  static at::Tensor run(at::TensorList inputs) {
    const Passes& ops = handles<Passes>();
    if constexpr (P == Pass::kScale) return below_autograd(ops.scale, inputs[0], inputs[1]);
    if constexpr (P == Pass::kReduce) return below_autograd(ops.reduce, inputs[0], inputs[1]);
    if constexpr (P == Pass::kInput) return below_autograd(ops.input, inputs[0], inputs[1], inputs[2]);
  }

  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs) {
    ctx->set_materialize_grads(false);
    // backward_input's grad_pool enters alone and linearly: its own value is not needed.
    ctx->save_for_backward(variable_list(inputs.begin(), inputs.begin() + 2));
    return run(inputs);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(kInputs);  // one per input
    if (!grads[0].defined()) return out;
    const variable_list saved = ctx->get_saved_variables();
    for (size_t i = 0; i < kInputs; ++i) {
      if (ctx->needs_input_grad(i)) out[i] = gradient(i, grads[0], saved[0], saved[1]);
    }
    return out;
  }

 private:
  // The gradient of input i, given the incoming gradient g and the first two inputs a, b.
  static at::Tensor gradient(size_t i, const at::Tensor& g, const at::Tensor& a, const at::Tensor& b) {
    const Passes& ops = handles<Passes>();
    if constexpr (P == Pass::kScale) {  // y = x * s (a = x, b = s): g * s, sum_hw g * x
      return i == 0 ? backward_call(ops.scale, g, b) : backward_call(ops.reduce, g, a);
    }
    if constexpr (P == Pass::kReduce) {  // ds = sum_hw g_out * x (a = g_out, b = x): x * g, g_out * g
      return backward_call(ops.scale, i == 0 ? b : a, g);
    }
    if constexpr (P == Pass::kInput) {  // dx = g_out * s + dp / HW (a = g_out, b = s): g * s, sum_hw g * g_out, pool(g)
      if (i == 2) return backward_call(ops.pool, g);
      return i == 0 ? backward_call(ops.scale, g, b) : backward_call(ops.reduce, g, a);
    }
  }
};

at::Tensor pool_autograd(const at::Tensor& x) {
  if (!records_grad({&x})) return below_autograd(handles<Passes>().pool, x);
  return PoolFunction::apply(x);
}

// The Autograd kernel of scale, reduce (Inputs: two tensors) and backward_input (three).
template <Pass P, typename... Inputs>
at::Tensor pass_autograd(const Inputs&... inputs) {
  static_assert(sizeof...(Inputs) == PassFunction<P>::kInputs, "one tensor per input of the pass");
  if (!records_grad({&inputs...})) return PassFunction<P>::run(at::TensorList{inputs...});
  return PassFunction<P>::apply(at::TensorList{inputs...});
}

}  // namespace
}  // namespace fastops

TORCH_LIBRARY_IMPL(fastops, Autograd, m) {
  m.impl("squeeze_excite", &fastops::squeeze_excite_autograd);
  m.impl("squeeze_excite_pool", &fastops::pool_autograd);
  m.impl("squeeze_excite_scale", &fastops::pass_autograd<fastops::Pass::kScale, at::Tensor, at::Tensor>);
  m.impl("squeeze_excite_backward_reduce", &fastops::pass_autograd<fastops::Pass::kReduce, at::Tensor, at::Tensor>);
  m.impl("squeeze_excite_backward_input",
         &fastops::pass_autograd<fastops::Pass::kInput, at::Tensor, at::Tensor, at::Tensor>);
}

TORCH_LIBRARY_IMPL(fastops, CPU, m) {
  m.impl("squeeze_excite_pool", FASTOPS_CPU_KERNEL(squeeze_excite_pool));
  m.impl("squeeze_excite_scale", FASTOPS_CPU_KERNEL(squeeze_excite_scale));
  m.impl("squeeze_excite_backward_reduce", FASTOPS_CPU_KERNEL(squeeze_excite_backward_reduce));
  m.impl("squeeze_excite_backward_input", FASTOPS_CPU_KERNEL(squeeze_excite_backward_input));
  m.impl("squeeze_excite", &fastops::squeeze_excite_no_autograd);
  m.impl("squeeze_excite_forward", &fastops::squeeze_excite_forward);
  m.impl("squeeze_excite_backward", &fastops::squeeze_excite_backward);
}

#ifdef FASTOPS_WITH_CUDA
TORCH_LIBRARY_IMPL(fastops, CUDA, m) {
  m.impl("squeeze_excite", &fastops::squeeze_excite_no_autograd);
  m.impl("squeeze_excite_forward", &fastops::squeeze_excite_forward);
  m.impl("squeeze_excite_backward", &fastops::squeeze_excite_backward);
}
#endif
