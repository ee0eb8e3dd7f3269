// depthwise_conv2d's NCHW kernels on the CPU (the math: cpu/depthwise_conv2d.cpp).
//
// One (n, c) plane per task. The zero-padded input plane is copied (and widened) into sh*sw phase
// planes: padded column j lands in phase j % sw at position j / sw (rows likewise). In phase space
// every tap of every stride and dilation reads a contiguous run that starts at a fixed offset, so
// the whole output plane is one flat loop over q = oh * pitch + ow: out[q] = b + sum_t w_t *
// phase_t[q + off_t], 4 vectors of accumulators in registers, the K*K taps innermost. The columns
// ow >= OW of each pitch-wide row are computed and dropped (this keeps 7x7 planes vectorized).
// The input gradient is the same flat gather on the grad_output plane placed in a zero frame, one
// phase of dx at a time (a stride-s dgrad is s*s small stride-1 correlations). The weight gradient
// runs over the phase planes row by row (exact widths, so padding columns never meet data) and
// leaves one row of partial sums per (n, c) plane, which the caller adds over n in order.
//
// fp32 takes a specialised path first where one applies (fast_path below), each in a file of its own:
// channel-blocked small maps (depthwise_conv2d_nchw_blocked.cpp), small planes held in registers on
// AVX-512 (_register.cpp) and 3x3 rows over 16 wide on AVX-512 and AVX2 (_wide.cpp). fp16/bf16
// tensors take those fp32 paths through chunks widened into fp32 buffers where that beats the phase
// planes (_half.cpp); fp64 runs the phase planes. What the files share: depthwise_conv2d_nchw.h.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <fastops/cpu_reduce.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>
#include <fastops/depthwise_cpu.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "depthwise_conv2d_nchw.h"

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace nchw {
namespace {

// out[q] = init + sum_t w[t] * src[t][q] for q in [0, n); n is rounded up to whole vectors, so
// out and every src[t] must hold round_up(n, 4 * V) elements (the phase planes carry that slack).
template <typename A>
void flat_gather(A* out, int64_t n, const A* const* src, const A* w, int64_t taps, A init) {
  using V = at::vec::Vectorized<A>;
  constexpr int64_t L = V::size();
  const V vinit(init);
  for (int64_t q = 0; q < n; q += 4 * L) {
    V a0 = vinit, a1 = vinit, a2 = vinit, a3 = vinit;
    for (int64_t t = 0; t < taps; ++t) {
      const V wt(w[t]);
      const A* s = src[t] + q;
      a0 = at::vec::fmadd(V::loadu(s), wt, a0);
      a1 = at::vec::fmadd(V::loadu(s + L), wt, a1);
      a2 = at::vec::fmadd(V::loadu(s + 2 * L), wt, a2);
      a3 = at::vec::fmadd(V::loadu(s + 3 * L), wt, a3);
    }
    a0.store(out + q);
    a1.store(out + q + L);
    a2.store(out + q + 2 * L);
    a3.store(out + q + 3 * L);
  }
}

// ---- phase planes --------------------------------------------------------------------------------

// The padded input plane split by stride phase. Padded row r = ih + pad_top goes to phase r % sh,
// row r / sh; columns likewise. Each phase plane is rows x pitch (+ slack), zero where padding.
struct PhaseLayout {
  int64_t sh, sw, rows, pitch, plane;  // plane: elements per phase plane, slack included
  int64_t phases() const { return sh * sw; }
};

PhaseLayout phase_layout(int64_t sh, int64_t sw, int64_t rows, int64_t pitch, int64_t vec) {
  PhaseLayout p{sh, sw, rows, pitch, 0};
  p.plane = round_up(rows * pitch, 4 * vec) + 4 * vec;
  return p;
}

// Fills the phase planes from the h x w plane src (row stride w) whose element (i, j) sits at padded
// position (i + top, j + left); top/left may be negative (rows/columns then cut off).
template <typename T, typename A>
void fill_phases(A* buf, const PhaseLayout& p, const T* src, int64_t h, int64_t w, int64_t top, int64_t left) {
  std::fill(buf, buf + p.plane * p.phases(), A(0));
  const int64_t j0 = std::max<int64_t>(0, -left);
  for (int64_t i = std::max<int64_t>(0, -top); i < h; ++i) {
    const int64_t r = i + top;
    const int64_t row = r / p.sh;
    if (row >= p.rows) break;
    A* dst_rows = buf + (r % p.sh) * p.sw * p.plane + row * p.pitch;
    const T* s = src + i * w;
    if (p.sw == 1) {
      const int64_t n = std::min(w, p.pitch - left) - j0;
      if (n > 0) convert_row<T, A>(dst_rows + j0 + left, s + j0, n);
    } else {
      // Phase by phase: source column j = col * sw + ph - left, a strided read, no division.
      for (int64_t ph = 0; ph < p.sw; ++ph) {
        A* d = dst_rows + ph * p.plane;
        const int64_t col0 = std::max<int64_t>(0, div_up(left - ph, p.sw));
        const int64_t col1 = std::min(p.pitch, div_up(w + left - ph, p.sw));
        const T* sp = s + col0 * p.sw + ph - left;
        for (int64_t col = col0; col < col1; ++col, sp += p.sw) d[col] = static_cast<A>(*sp);
      }
    }
  }
}

// The input's phase planes as the forward and the weight gradient read them, and each tap's
// offset there: phase ((kh*dh) % sh, (kw*dw) % sw), row (kh*dh) / sh, column (kw*dw) / sw.
PhaseLayout input_phases(const DepthwiseGeometry& g, int64_t vec, std::vector<int64_t>& tap_off) {
  const int64_t pitch = g.OW + (g.KW - 1) * g.dw / g.sw + 1;
  const int64_t rows = g.OH + (g.KH - 1) * g.dh / g.sh + 1;
  const PhaseLayout p = phase_layout(g.sh, g.sw, rows, pitch, vec);
  tap_off.resize(g.taps());
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const int64_t phase = ((kh * g.dh) % g.sh) * g.sw + (kw * g.dw) % g.sw;
      tap_off[kh * g.KW + kw] = phase * p.plane + (kh * g.dh / g.sh) * pitch + kw * g.dw / g.sw;
    }
  }
  return p;
}

// ---- input gradient ------------------------------------------------------------------------------

// dx in phase space: padded row R = ih + pt = row * sh + phr. A tap (kh, kw) reaches phase
// (phr, phc) = ((kh*dh) % sh, (kw*dw) % sw) and there reads g[row - (kh*dh)/sh, col - (kw*dw)/sw].
// g sits in a zero frame of fr rows on top and fc columns on the left, so every read is in bounds.
struct DgradFrame {
  int64_t fr, fc;            // the zero frame around g
  int64_t rows_dx, cols_dx;  // dx rows and columns per phase
  PhaseLayout framed;        // the framed g plane (one phase)
  int64_t n_dx;              // elements of one dx phase, pitch-wide rows
  // Per phase: the taps landing there and their offsets into the framed g plane.
  std::vector<std::vector<int64_t>> phase_taps, phase_offs;
};

DgradFrame dgrad_frame(const DepthwiseGeometry& g, int64_t vec) {
  DgradFrame f;
  f.fr = (g.KH - 1) * g.dh / g.sh;
  f.fc = (g.KW - 1) * g.dw / g.sw;
  f.rows_dx = div_up(g.pt + g.H, g.sh);
  f.cols_dx = div_up(g.pl + g.W, g.sw);
  const int64_t pitch = std::max(f.cols_dx, g.OW + f.fc) + 1;
  const int64_t grows = std::max(f.rows_dx, g.OH) + f.fr + 1;
  f.framed = phase_layout(1, 1, grows, pitch, vec);
  f.n_dx = f.rows_dx * pitch;
  f.phase_taps.resize(g.sh * g.sw);
  f.phase_offs.resize(g.sh * g.sw);
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const int64_t phase = ((kh * g.dh) % g.sh) * g.sw + (kw * g.dw) % g.sw;
      f.phase_taps[phase].push_back(kh * g.KW + kw);
      f.phase_offs[phase].push_back((f.fr - kh * g.dh / g.sh) * pitch + (f.fc - kw * g.dw / g.sw));
    }
  }
  return f;
}

// Writes phase (phr, phc) of dx, computed pitch-wide into out, back to the dx plane: padded
// (R, Cc) = (row*sh + phr, col*sw + phc) -> (R - pt, Cc - pl).
template <typename T, typename A>
void scatter_phase(T* dxplane, const A* out, const DgradFrame& f, const DepthwiseGeometry& g, int64_t phr,
                   int64_t phc) {
  const int64_t pitch = f.framed.pitch;
  for (int64_t row = 0; row < f.rows_dx; ++row) {
    const int64_t ih = row * g.sh + phr - g.pt;
    if (ih < 0 || ih >= g.H) continue;
    const A* o = out + row * pitch;
    T* d = dxplane + ih * g.W;
    if (g.sw == 1) {
      const int64_t iw0 = std::max<int64_t>(0, -g.pl + phc);
      store_row<T, A>(d + iw0, o + iw0 + g.pl, g.W - iw0);
    } else {
      const int64_t col0 = std::max<int64_t>(0, div_up(g.pl - phc, g.sw));
      const int64_t col1 = std::min(f.cols_dx, div_up(g.W + g.pl - phc, g.sw));
      for (int64_t col = col0; col < col1; ++col) d[col * g.sw + phc - g.pl] = static_cast<T>(o[col]);
    }
  }
}

// ---- weight gradient -----------------------------------------------------------------------------

// out[t] = sum over the plane of g * x at tap t, for every tap, then out[taps] = sum of g: the
// input's phase planes in buf, the plane's grad_output (in A) in gb.
template <typename A>
void plane_weight_sums(A* out, const A* buf, const A* gb, const std::vector<int64_t>& tap_off, int64_t pitch,
                       const DepthwiseGeometry& g) {
  using V = at::vec::Vectorized<A>;
  constexpr int64_t L = V::size();
  constexpr int64_t G = 8;  // taps per group: 8 accumulators + 1 grad vector stay in registers
  const int64_t taps = g.taps();
  for (int64_t t0 = 0; t0 < taps; t0 += G) {
    const int64_t nt = std::min(G, taps - t0);
    V acc[G];
    for (int64_t j = 0; j < G; ++j) acc[j] = V(A(0));
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const A* grow = gb + oh * g.OW;
      const A* xrow = buf + oh * pitch;
      for (int64_t ow = 0; ow < g.OW; ow += L) {
        const int64_t cnt = std::min(L, g.OW - ow);
        const V gv = V::loadu(grow + ow, cnt);
        for (int64_t j = 0; j < G; ++j) {
          if (j < nt) acc[j] = at::vec::fmadd(gv, V::loadu(xrow + tap_off[t0 + j] + ow, cnt), acc[j]);
        }
      }
    }
    for (int64_t j = 0; j < nt; ++j) out[t0 + j] = horizontal_sum<A>(acc[j]);
  }
  V bacc(A(0));
  const int64_t n = g.OH * g.OW;
  for (int64_t i = 0; i < n; i += L) bacc = bacc + V::loadu(gb + i, std::min(L, n - i));
  out[taps] = horizontal_sum<A>(bacc);
}

}  // namespace

// ---- the specialised fp32 paths ------------------------------------------------------------------

FastPath fast_path(const DepthwiseGeometry& g, Pass pass) {
#if defined(CPU_CAPABILITY_AVX512)
  const bool stride1 = g.sh == 1 && g.sw == 1;
  if ((pass != Pass::kInputGradient || stride1) && use_register_plane(g, pass == Pass::kWeightGradient)) {
    return FastPath::kRegister;
  }
#endif
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if (use_wide_rows(g, pass)) return FastPath::kWide;
#endif
  return use_blocked(g, pass) ? FastPath::kBlocked : FastPath::kNone;
}

void run_conv(FastPath path, Pass pass, float* out, const float* in, const float* w, const float* bias,
              const DepthwiseGeometry& g) {
  const bool dgrad = pass == Pass::kInputGradient;
  switch (path) {
#if defined(CPU_CAPABILITY_AVX512)
    case FastPath::kRegister:
      register_conv(out, in, w, bias, g, dgrad);
      return;
#endif
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    case FastPath::kWide:
      if (dgrad) {
        wide_input_gradient(out, in, w, g);
      } else {
        wide_forward(out, in, w, bias, g);
      }
      return;
#endif
    case FastPath::kBlocked:
      blocked_conv(out, in, w, bias, g, dgrad);
      return;
    default:
      TORCH_INTERNAL_ASSERT(false, "depthwise_conv2d: no fp32 path here");
  }
}

int64_t images_per_weight_row(FastPath path) {
#if defined(CPU_CAPABILITY_AVX512)
  if (path == FastPath::kRegister) return kWgradImages;
#endif
  return 1;
}

void run_weight_sums(FastPath path, float* ws, const float* x, const float* go, const DepthwiseGeometry& g) {
  switch (path) {
#if defined(CPU_CAPABILITY_AVX512)
    case FastPath::kRegister:
      register_wgrad(ws, x, go, g);
      return;
#endif
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    case FastPath::kWide:
      wide_weight_sums(ws, x, go, g);
      return;
#endif
    case FastPath::kBlocked:
      blocked_wgrad(ws, x, go, g);
      return;
    default:
      TORCH_INTERNAL_ASSERT(false, "depthwise_conv2d: no fp32 weight-gradient path here");
  }
}

namespace {

// The forward or input gradient on a specialised path, where one applies to T and g: false where the
// phase planes are to run.
template <typename T>
bool fast_conv(Pass pass, T* out, const T* in, const opmath_t<T>* w, const opmath_t<T>* bias,
               const DepthwiseGeometry& g) {
  if constexpr (std::is_same_v<opmath_t<T>, float>) {
    const FastPath path = fast_path(g, pass);
    if constexpr (std::is_same_v<T, float>) {
      if (path == FastPath::kNone) return false;
      run_conv(path, pass, out, in, w, bias, g);
      return true;
    } else {
      if (!half_through_fp32(path, g, pass)) return false;
      half_conv<T>(path, pass, out, in, w, bias, g);
      return true;
    }
  }
  return false;
}

// ---- the kernels ---------------------------------------------------------------------------------
// fp32 and fp16/bf16 take a specialised path where one applies (fp16/bf16 through fp32 chunks), the
// rest (and fp64) the phase planes.
template <typename T>
void forward(const at::Tensor& x, const at::Tensor& wacc, const at::Tensor& bacc, at::Tensor& y,
             const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  constexpr int64_t L = at::vec::Vectorized<A>::size();
  const int64_t taps = g.taps();
  const T* xp = x.const_data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const A* wp = wacc.const_data_ptr<A>();
  const A* bp = bacc.defined() ? bacc.const_data_ptr<A>() : nullptr;
  if (fast_conv<T>(Pass::kForward, yp, xp, wp, bp, g)) return;
  std::vector<int64_t> tap_off;
  const PhaseLayout p = input_phases(g, L, tap_off);
  const int64_t pitch = p.pitch;
  const int64_t n_out = g.OH * pitch;
  at::parallel_for(0, g.N * g.C, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> buf(p.plane * p.phases());
    std::vector<A> out(round_up(n_out, 4 * L));
    std::vector<const A*> src(taps);
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t c = plane % g.C;
      fill_phases<T, A>(buf.data(), p, xp + plane * g.H * g.W, g.H, g.W, g.pt, g.pl);
      for (int64_t t = 0; t < taps; ++t) src[t] = buf.data() + tap_off[t];
      flat_gather<A>(out.data(), n_out, src.data(), wp + c * taps, taps, bp ? bp[c] : A(0));
      T* yplane = yp + plane * g.OH * g.OW;
      for (int64_t oh = 0; oh < g.OH; ++oh) store_row<T, A>(yplane + oh * g.OW, out.data() + oh * pitch, g.OW);
    }
  });
}

template <typename T>
void backward_input(const at::Tensor& go, const at::Tensor& wacc, at::Tensor& dx, const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  constexpr int64_t L = at::vec::Vectorized<A>::size();
  const int64_t taps = g.taps();
  const T* gp = go.const_data_ptr<T>();
  T* dxp = dx.data_ptr<T>();
  const A* wp = wacc.const_data_ptr<A>();
  if (fast_conv<T>(Pass::kInputGradient, dxp, gp, wp, nullptr, g)) return;
  const DgradFrame f = dgrad_frame(g, L);
  at::parallel_for(0, g.N * g.C, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> gbuf(f.framed.plane);
    std::vector<A> out(round_up(f.n_dx, 4 * L));
    std::vector<const A*> src(taps);
    std::vector<A> wt(taps);
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t c = plane % g.C;
      fill_phases<T, A>(gbuf.data(), f.framed, gp + plane * g.OH * g.OW, g.OH, g.OW, f.fr, f.fc);
      T* dxplane = dxp + plane * g.H * g.W;
      for (int64_t phr = 0; phr < g.sh; ++phr) {
        for (int64_t phc = 0; phc < g.sw; ++phc) {
          const auto& pt = f.phase_taps[phr * g.sw + phc];
          const auto& po = f.phase_offs[phr * g.sw + phc];
          const int64_t nt = static_cast<int64_t>(pt.size());
          for (int64_t t = 0; t < nt; ++t) {
            src[t] = gbuf.data() + po[t];
            wt[t] = wp[c * taps + pt[t]];
          }
          flat_gather<A>(out.data(), f.n_dx, src.data(), wt.data(), nt, A(0));
          scatter_phase<T, A>(dxplane, out.data(), f, g, phr, phc);
        }
      }
    }
  });
}

template <typename T>
at::Tensor weight_partials(const at::Tensor& go, const at::Tensor& x, const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  constexpr int64_t L = at::vec::Vectorized<A>::size();
  const T* xp = x.const_data_ptr<T>();
  const T* gp = go.const_data_ptr<T>();
  const auto options = x.options().dtype(c10::CppTypeToScalarType<A>::value);
  if constexpr (std::is_same_v<A, float>) {
    const FastPath path = fast_path(g, Pass::kWeightGradient);
    if (path != FastPath::kNone && (std::is_same_v<T, float> || half_through_fp32(path, g, Pass::kWeightGradient))) {
      // (the register path: one partial row per kWgradImages images, not per image)
      at::Tensor ws = at::empty({div_up(g.N, images_per_weight_row(path)), g.C, g.taps() + 1}, options);
      if constexpr (std::is_same_v<T, float>) {
        run_weight_sums(path, ws.data_ptr<float>(), xp, gp, g);
      } else {
        half_weight_sums<T>(path, ws.data_ptr<float>(), xp, gp, g);
      }
      return ws;
    }
  }
  std::vector<int64_t> tap_off;
  const PhaseLayout p = input_phases(g, L, tap_off);
  at::Tensor ws = at::empty({g.N, g.C, g.taps() + 1}, options);
  A* wsp = ws.data_ptr<A>();
  at::parallel_for(0, g.N * g.C, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> buf(p.plane * p.phases());
    std::vector<A> gb(g.OH * g.OW);
    for (int64_t plane = begin; plane < end; ++plane) {
      fill_phases<T, A>(buf.data(), p, xp + plane * g.H * g.W, g.H, g.W, g.pt, g.pl);
      convert_row<T, A>(gb.data(), gp + plane * g.OH * g.OW, g.OH * g.OW);
      plane_weight_sums<A>(wsp + plane * (g.taps() + 1), buf.data(), gb.data(), tap_off, p.pitch, g);
    }
  });
  return ws;
}

}  // namespace

}  // namespace nchw
}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {

template <typename T>
DepthwiseLayoutKernels<T> nchw_kernels() {
  return {&nchw::forward<T>, &nchw::backward_input<T>, &nchw::weight_partials<T>};
}

template DepthwiseLayoutKernels<float> nchw_kernels<float>();
template DepthwiseLayoutKernels<double> nchw_kernels<double>();
template DepthwiseLayoutKernels<c10::Half> nchw_kernels<c10::Half>();
template DepthwiseLayoutKernels<c10::BFloat16> nchw_kernels<c10::BFloat16>();

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
