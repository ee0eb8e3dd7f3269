// depthwise_separable_conv2d on the CPU: a k x k depthwise conv and the 1x1 conv after it, fused.
//   z[n,oh,ow,c]  = db[c] + sum_{kh,kw} dw[c,kh,kw] * x[n, oh*sh + kh*dh - pt, ow*sw + kw*dw - pl, c]
//   y[n,oh,ow,co] = pb[co] + sum_c pw[co,c] * z[n,oh,ow,c]
// Layout: NHWC. A channels_last x is read in place; any other x is converted to channels_last first
// (one extra copy). The output is always channels_last.
//
// Strategy: the N*OH*OW output pixels (in NHWC order) are cut into tiles of P consecutive pixels
// (P ~ 16K / C, a multiple of 8, so the P x C depthwise tile stays in L1/L2); tasks are runs of
// tiles. Per tile the depthwise output of all C channels is computed with the depthwise op's own
// NHWC row kernels (NhwcForwardRow: register-blocked along the row, fp32 accumulators, rounded to
// the input dtype exactly as the unfused depthwise op would store it), then multiplied by the
// pointwise weight with a register-blocked micro-GEMM (up to 8 pixels x up to 4 vectors of output
// channels, broadcast-FMA over c; weight pre-transposed to (C, Cout_p) in fp32/fp64) into a
// P x Cout tile that is written once to y. The depthwise intermediate z never goes to memory.
// There is no CUDA kernel (a CUDA call is refused by name: csrc/depthwise_separable_conv2d_op.cpp;
// the module runs the unfused pair on CUDA).
//
// Bytes per call: reads x (N*H*W*C) and writes y (N*OH*OW*Cout); the unfused pair additionally
// writes and reads z (2 * N*OH*OW*C * itemsize). FLOPs: 2*N*OH*OW*C*(kh*kw + Cout).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <fastops/checks.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>
#include <fastops/depthwise_cpu.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

constexpr const char* kOp = "depthwise_separable_conv2d";

// out[p][co..co+VB*L) = init + sum_c tile[p][c] * wt[c][co..] for PB pixels; out has row pitch Coutp,
// tile row pitch C. Indices are compile-time constants (static_for), so acc and w stay in registers.
template <typename A, int PB, int VB>
inline void pw_block(A* out, const A* tile, const A* wt, int64_t C, int64_t Coutp, int64_t co, const A* init) {
  using V = at::vec::Vectorized<A>;
  constexpr int64_t L = V::size();
  V acc[PB][VB];
  static_for<VB>([&](auto v) {
    const V i0 = init ? V::loadu(init + co + v * L) : V(A(0));
    static_for<PB>([&](auto p) { acc[p][v] = i0; });
  });
  for (int64_t c = 0; c < C; ++c) {
    V w[VB];
    const A* wc = wt + c * Coutp + co;
    static_for<VB>([&](auto v) { w[v] = V::loadu(wc + v * L); });
    static_for<PB>([&](auto p) {
      const V xb(tile[p * C + c]);
      static_for<VB>([&](auto v) { acc[p][v] = at::vec::fmadd(xb, w[v], acc[p][v]); });
    });
  }
  static_for<PB>([&](auto p) { static_for<VB>([&](auto v) { acc[p][v].store(out + p * Coutp + co + v * L); }); });
}

// Pixels per register block for VB output-channel vectors: as many as the vector registers hold
// next to the VB weight vectors and a broadcast (32 registers with AVX512, 16 otherwise), at most 8.
template <typename A, int VB>
constexpr int pixels_per_block() {
  constexpr int regs = sizeof(at::vec::Vectorized<A>) >= 64 ? 32 : 16;
  return std::max(1, std::min(8, (regs - VB - 2) / VB));
}

// out (np x Coutp) = init + tile (np x C) @ wt (C x Coutp), for one chunk of VB vectors of output
// channels at co: register blocks of PB pixels, then 4, then 1 for the rest.
template <typename A, int VB>
inline void pw_chunk(A* out, const A* tile, int64_t np, const A* wt, int64_t C, int64_t Coutp, int64_t co,
                     const A* init) {
  constexpr int PB = pixels_per_block<A, VB>();
  int64_t p = 0;
  for (; p + PB <= np; p += PB) pw_block<A, PB, VB>(out + p * Coutp, tile + p * C, wt, C, Coutp, co, init);
  if constexpr (PB > 4) {
    for (; p + 4 <= np; p += 4) pw_block<A, 4, VB>(out + p * Coutp, tile + p * C, wt, C, Coutp, co, init);
  }
  for (; p < np; ++p) pw_block<A, 1, VB>(out + p * Coutp, tile + p * C, wt, C, Coutp, co, init);
}

template <typename A>
void pointwise_tile(A* out, const A* tile, int64_t np, const A* wt, int64_t C, int64_t Coutp, const A* init) {
  constexpr int64_t L = at::vec::Vectorized<A>::size();
  // Chunks of 3 vectors while more than 4 remain, then one chunk of the last 1..4 (so a lone
  // 1-vector chunk, which is broadcast-bound, only happens when Cout fits in one vector).
  int64_t co = 0;
  for (; Coutp - co > 4 * L; co += 3 * L) pw_chunk<A, 3>(out, tile, np, wt, C, Coutp, co, init);
  switch ((Coutp - co) / L) {
    case 4:
      pw_chunk<A, 4>(out, tile, np, wt, C, Coutp, co, init);
      break;
    case 3:
      pw_chunk<A, 3>(out, tile, np, wt, C, Coutp, co, init);
      break;
    case 2:
      pw_chunk<A, 2>(out, tile, np, wt, C, Coutp, co, init);
      break;
    case 1:
      pw_chunk<A, 1>(out, tile, np, wt, C, Coutp, co, init);
      break;
    default:
      TORCH_INTERNAL_ASSERT(co == Coutp);
  }
}

// Shapes, then devices, then dtypes (the fake kernel in fastops/ops/depthwise_separable_conv2d.py checks
// the shapes alike). Under autocast the autocast kernel has cast the tensors already.
void check_inputs(const at::Tensor& x, const at::Tensor& dw_weight, const std::optional<at::Tensor>& dw_bias,
                  const at::Tensor& pw_weight, const std::optional<at::Tensor>& pw_bias) {
  const char* op = kOp;
  FASTOPS_CHECK_SHAPE(x.dim() == 4, "fastops.", op, ": expected x to be 4-D (N, C, H, W), got shape ",
                      str(as_tuple(x.sizes())));
  const int64_t C = x.size(1);
  FASTOPS_CHECK_SHAPE(dw_weight.dim() == 4 && dw_weight.size(1) == 1 && dw_weight.size(0) == C, "fastops.", op,
                      ": expected dw_weight of shape (", str(C), ", 1, kh, kw) (channel multiplier 1), got ",
                      str(as_tuple(dw_weight.sizes())));
  FASTOPS_CHECK_SHAPE(dw_weight.size(2) >= 1 && dw_weight.size(3) >= 1, "fastops.", op,
                      ": expected a kernel of at least 1 x 1, got dw_weight of shape ",
                      str(as_tuple(dw_weight.sizes())));
  FASTOPS_CHECK_SHAPE(
      pw_weight.dim() == 4 && pw_weight.size(1) == C && pw_weight.size(2) == 1 && pw_weight.size(3) == 1, "fastops.",
      op, ": expected pw_weight of shape (Cout, ", str(C), ", 1, 1), got ", str(as_tuple(pw_weight.sizes())));
  const at::Tensor none;
  const at::Tensor& db = dw_bias.has_value() ? *dw_bias : none;
  const at::Tensor& pb = pw_bias.has_value() ? *pw_bias : none;
  const auto check_bias_shape = [&](const char* arg, const at::Tensor& b, int64_t n) {
    FASTOPS_CHECK_SHAPE(!b.defined() || (b.dim() == 1 && b.size(0) == n), "fastops.", op, ": expected ", arg,
                        " of shape (", str(n), ",), got ", str(as_tuple(b.sizes())));
  };
  check_bias_shape("dw_bias", db, C);
  check_bias_shape("pw_bias", pb, pw_weight.size(0));
  const std::pair<const char*, const at::Tensor*> others[] = {
      {"dw_weight", &dw_weight}, {"dw_bias", &db}, {"pw_weight", &pw_weight}, {"pw_bias", &pb}};
  for (const auto& [arg, t] : others) {
    if (t->defined()) check_same_device(op, arg, *t, "x", x);
  }
  check_floating(op, "x", x);
  for (const auto& [arg, t] : others) {
    if (t->defined()) check_same_dtype(op, arg, *t, "x", x);
  }
}

template <typename T>
void forward(const at::Tensor& x, const at::Tensor& dwt, const at::Tensor& dwb, const at::Tensor& pwt,
             const at::Tensor& pwb, at::Tensor& y, const DepthwiseGeometry& g, int64_t Cout) {
  using A = opmath_t<T>;
  const int64_t C = g.C, Coutp = pwt.size(1);
  // Tile: P consecutive output pixels in (n, oh, ow) order (a multiple of 8, spanning rows where they
  // are short, so 7x7 and 14x14 maps still feed the 1x1 full register blocks), P * C depthwise values
  // (<= 64 KiB of fp32, so the tile is still in L2 when the 1x1 reads it).
  const int64_t total = g.N * g.OH * g.OW;
  const int64_t P = std::min(total, std::clamp<int64_t>(16384 / std::max<int64_t>(C, 1) / 8 * 8, 8, 128));
  const int64_t tiles = div_up(total, P);
  const T* xp = x.const_data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const A* dwp = dwt.const_data_ptr<A>();
  const A* dbp = dwb.defined() ? dwb.const_data_ptr<A>() : nullptr;
  const A* pwp = pwt.const_data_ptr<A>();
  const A* pbp = pwb.defined() ? pwb.const_data_ptr<A>() : nullptr;
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(1, P * (C + Cout)));
  at::parallel_for(0, tiles, grain, [&](int64_t begin, int64_t end) {
    NhwcForwardRow<T> row(g, dwp, dwt.size(1), dbp);
    std::vector<T> z(P * C);  // the depthwise tile, in the input dtype (as the unfused op stores it)
    std::vector<A> za(std::is_same_v<T, A> ? 0 : P * C);
    std::vector<A> out(P * Coutp);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t q0 = task * P, q1 = std::min(total, q0 + P), np = q1 - q0;
      // The tile's pixels, one output-row segment at a time.
      for (int64_t q = q0; q < q1;) {
        const int64_t r = q / g.OW, ow = q % g.OW, seg = std::min(q1 - q, g.OW - ow);
        row.run(z.data() + (q - q0) * C, xp + (r / g.OH) * g.H * g.W * C, r % g.OH, ow, ow + seg);
        q += seg;
      }
      const A* tile;
      if constexpr (std::is_same_v<T, A>) {
        tile = z.data();
      } else {
        convert_row<T, A>(za.data(), z.data(), np * C);
        tile = za.data();
      }
      pointwise_tile<A>(out.data(), tile, np, pwp, C, Coutp, pbp);
      T* yt = yp + q0 * Cout;
      for (int64_t p = 0; p < np; ++p) store_row<T, A>(yt + p * Cout, out.data() + p * Coutp, Cout);
    }
  });
}

}  // namespace

at::Tensor depthwise_separable_conv2d(const at::Tensor& x_in, const at::Tensor& dw_weight,
                                      const std::optional<at::Tensor>& dw_bias, const at::Tensor& pw_weight,
                                      const std::optional<at::Tensor>& pw_bias, at::IntArrayRef stride,
                                      at::IntArrayRef padding, at::IntArrayRef dilation) {
  check_inputs(x_in, dw_weight, dw_bias, pw_weight, pw_bias);
  const DepthwiseGeometry g =
      make_depthwise_geometry(kOp, x_in.sizes(), dw_weight.size(2), dw_weight.size(3), stride, padding, dilation);
  const int64_t Cout = pw_weight.size(0);
  const at::Tensor x = x_in.contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor y = at::empty({g.N, Cout, g.OH, g.OW}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  if (y.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_dwpw_conv2d_cpu", [&] {
    using A = opmath_t<scalar_t>;
    const auto acc = c10::CppTypeToScalarType<A>::value;
    constexpr int64_t L = opmath_vec_size<scalar_t>();
    const at::Tensor dwt = weights_acc(dw_weight, acc, /*transposed=*/true, L);
    const at::Tensor dwb = bias_acc(dw_bias, acc, L);
    // Pointwise weight as (C, Cout_p) in the accumulation type, output channels zero-padded to vectors
    // (weights_acc's (taps, Cp) transpose with the C input channels in the role of the taps).
    const at::Tensor pwt = weights_acc(pw_weight.reshape({Cout, 1, g.C, 1}), acc, /*transposed=*/true, L);
    const at::Tensor pwb = bias_acc(pw_bias, acc, L);
    TORCH_INTERNAL_ASSERT(pwt.size(0) == g.C && pwt.size(1) % L == 0);
    forward<scalar_t>(x, dwt, dwb, pwt, pwb, y, g, Cout);
  });
  return y;
}

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
