// depthwise_conv2d on the CPU: forward, input gradient, weight + bias gradient; NCHW and NHWC.
//   forward:  y[n,c,oh,ow] = b[c] + sum_{kh,kw} w[c,kh,kw] * x[n,c, oh*sh + kh*dh - pt, ow*sw + kw*dw - pl]
//   dgrad:    dx[n,c,ih,iw] = sum over (kh,kw,oh,ow) hitting (ih,iw) of w[c,kh,kw] * g[n,c,oh,ow]
//   wgrad:    dw[c,kh,kw] = sum_{n,oh,ow} g * x[...];  db[c] = sum_{n,oh,ow} g
// Math in fp32 for fp16/bf16/fp32 (fp64 for fp64 inputs); weights are converted once to that type.
//
// NCHW strategy: one (n, c) plane per task. The zero-padded input plane is copied (and widened) into
// sh*sw phase planes: padded column j lands in phase j % sw at position j / sw (rows likewise). In
// phase space every tap of every stride and dilation reads a contiguous run that starts at a fixed
// offset, so the whole output plane is one flat loop over q = oh * pitch + ow: out[q] = b + sum_t
// w_t * phase_t[q + off_t], 4 vectors of accumulators in registers, the K*K taps innermost. The
// columns ow >= OW of each pitch-wide row are computed and dropped (this keeps 7x7 planes vectorized).
// The input gradient is the same flat gather on the grad_output plane placed in a zero frame, one
// phase of dx at a time (a stride-s dgrad is s*s small stride-1 correlations). The weight gradient
// runs over the phase planes row by row (exact widths, so padding columns never meet data).
//
// NHWC strategy: one output row (n, oh) per task; per pixel the list of in-bounds taps is built once,
// then the channel loop runs over it with 4 vectors of channels per step (weights pre-transposed to
// [tap][C]). The input gradient is the same gather seen from the input side (taps whose stride phase
// matches). The weight gradient splits the N*OH output rows into a fixed number of fixed-size items
// (a function of the shape only, never of the thread count); each item writes its partial
// [tap][C] sums to a workspace slot and the slots are added in item order: deterministic and
// bitwise repeatable, no atomics, one pass over x and grad_output from memory.
//
// Bytes per call (minimal): forward reads x and writes y (2 * N*C*H*W * itemsize for stride 1);
// dgrad reads g and writes dx; wgrad reads x and g. FLOPs: 2 * N*C*OH*OW*kh*kw each.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <fastops/checks.h>
#include <fastops/cpu_reduce.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>
#include <fastops/depthwise_nhwc_cpu.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace fastops::cpu {
namespace {

constexpr const char* kOp = "depthwise_conv2d";

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

// ---- NCHW phase planes ---------------------------------------------------------------------------

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

template <typename T>
void forward_nchw(const at::Tensor& x, const at::Tensor& wacc, const at::Tensor& bacc, at::Tensor& y,
                  const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  constexpr int64_t L = at::vec::Vectorized<A>::size();
  const int64_t taps = g.taps();
  std::vector<int64_t> tap_off;
  const PhaseLayout p = input_phases(g, L, tap_off);
  const int64_t pitch = p.pitch;
  const T* xp = x.const_data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const A* wp = wacc.const_data_ptr<A>();
  const A* bp = bacc.defined() ? bacc.const_data_ptr<A>() : nullptr;
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
void backward_input_nchw(const at::Tensor& go, const at::Tensor& wacc, at::Tensor& dx, const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  constexpr int64_t L = at::vec::Vectorized<A>::size();
  // dx in phase space: padded row R = ih + pt = row * sh + phr. A tap (kh, kw) reaches phase
  // (phr, phc) = ((kh*dh) % sh, (kw*dw) % sw) and there reads g[row - (kh*dh)/sh, col - (kw*dw)/sw].
  // g sits in a zero frame of fr rows on top and fc columns on the left, so every read is in bounds.
  const int64_t fr = (g.KH - 1) * g.dh / g.sh, fc = (g.KW - 1) * g.dw / g.sw;
  const int64_t rows_dx = div_up(g.pt + g.H, g.sh), cols_dx = div_up(g.pl + g.W, g.sw);
  const int64_t pitch = std::max(cols_dx, g.OW + fc) + 1;
  const int64_t grows = std::max(rows_dx, g.OH) + fr + 1;
  const PhaseLayout gl = phase_layout(1, 1, grows, pitch, L);
  const int64_t n_dx = rows_dx * pitch;
  const int64_t taps = g.taps();
  // Per phase: the taps landing there and their offsets into the framed g plane.
  std::vector<std::vector<int64_t>> phase_taps(g.sh * g.sw), phase_offs(g.sh * g.sw);
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const int64_t phase = ((kh * g.dh) % g.sh) * g.sw + (kw * g.dw) % g.sw;
      phase_taps[phase].push_back(kh * g.KW + kw);
      phase_offs[phase].push_back((fr - kh * g.dh / g.sh) * pitch + (fc - kw * g.dw / g.sw));
    }
  }
  const T* gp = go.const_data_ptr<T>();
  T* dxp = dx.data_ptr<T>();
  const A* wp = wacc.const_data_ptr<A>();
  at::parallel_for(0, g.N * g.C, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> gbuf(gl.plane);
    std::vector<A> out(round_up(n_dx, 4 * L));
    std::vector<const A*> src(taps);
    std::vector<A> wt(taps);
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t c = plane % g.C;
      fill_phases<T, A>(gbuf.data(), gl, gp + plane * g.OH * g.OW, g.OH, g.OW, fr, fc);
      T* dxplane = dxp + plane * g.H * g.W;
      for (int64_t phr = 0; phr < g.sh; ++phr) {
        for (int64_t phc = 0; phc < g.sw; ++phc) {
          const auto& pt = phase_taps[phr * g.sw + phc];
          const auto& po = phase_offs[phr * g.sw + phc];
          const int64_t nt = static_cast<int64_t>(pt.size());
          for (int64_t t = 0; t < nt; ++t) {
            src[t] = gbuf.data() + po[t];
            wt[t] = wp[c * taps + pt[t]];
          }
          flat_gather<A>(out.data(), n_dx, src.data(), wt.data(), nt, A(0));
          // Scatter this phase back: padded (R, Cc) = (row*sh + phr, col*sw + phc) -> (R - pt, Cc - pl).
          for (int64_t row = 0; row < rows_dx; ++row) {
            const int64_t ih = row * g.sh + phr - g.pt;
            if (ih < 0 || ih >= g.H) continue;
            const A* o = out.data() + row * pitch;
            T* d = dxplane + ih * g.W;
            if (g.sw == 1) {
              const int64_t iw0 = std::max<int64_t>(0, -g.pl + phc);
              store_row<T, A>(d + iw0, o + iw0 + g.pl, g.W - iw0);
            } else {
              const int64_t col0 = std::max<int64_t>(0, div_up(g.pl - phc, g.sw));
              const int64_t col1 = std::min(cols_dx, div_up(g.W + g.pl - phc, g.sw));
              for (int64_t col = col0; col < col1; ++col) d[col * g.sw + phc - g.pl] = static_cast<T>(o[col]);
            }
          }
        }
      }
    }
  });
}

// Weight and bias gradient, NCHW: per (n, c) plane the partial sums ws[plane][taps + 1] (the last
// slot is the bias), then a fixed-order sum over n.
template <typename T>
void backward_weight_nchw(const at::Tensor& go, const at::Tensor& x, at::Tensor& ws, const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  using V = at::vec::Vectorized<A>;
  constexpr int64_t L = V::size();
  constexpr int64_t G = 8;  // taps per group: 8 accumulators + 1 grad vector stay in registers
  const int64_t taps = g.taps();
  std::vector<int64_t> tap_off;
  const PhaseLayout p = input_phases(g, L, tap_off);
  const int64_t pitch = p.pitch;
  const T* xp = x.const_data_ptr<T>();
  const T* gp = go.const_data_ptr<T>();
  A* wsp = ws.data_ptr<A>();
  at::parallel_for(0, g.N * g.C, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> buf(p.plane * p.phases());
    std::vector<A> gb(g.OH * g.OW);
    for (int64_t plane = begin; plane < end; ++plane) {
      fill_phases<T, A>(buf.data(), p, xp + plane * g.H * g.W, g.H, g.W, g.pt, g.pl);
      convert_row<T, A>(gb.data(), gp + plane * g.OH * g.OW, g.OH * g.OW);
      A* out = wsp + plane * (taps + 1);
      for (int64_t t0 = 0; t0 < taps; t0 += G) {
        const int64_t nt = std::min(G, taps - t0);
        V acc[G];
        for (int64_t j = 0; j < G; ++j) acc[j] = V(A(0));
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const A* grow = gb.data() + oh * g.OW;
          const A* xrow = buf.data() + oh * pitch;
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
      for (int64_t i = 0; i < n; i += L) bacc = bacc + V::loadu(gb.data() + i, std::min(L, n - i));
      out[taps] = horizontal_sum<A>(bacc);
    }
  });
}

// ---- NHWC ------------------------------------------------------------------------------------------
// The forward's building blocks live in fastops/depthwise_nhwc_cpu.h (shared with the fused
// depthwise_separable_conv2d).

// Forward, NHWC: one output row (n, oh) per task.
template <typename T>
void forward_nhwc(const at::Tensor& x, const at::Tensor& wt, const at::Tensor& bt, at::Tensor& y,
                  const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  const T* xp = x.const_data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const A* bp = bt.defined() ? bt.const_data_ptr<A>() : nullptr;
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, g.OW * g.C));
  at::parallel_for(0, g.N * g.OH, grain, [&](int64_t begin, int64_t end) {
    NhwcForwardRow<T> row(g, wt.const_data_ptr<A>(), wt.size(1), bp);
    for (int64_t r = begin; r < end; ++r) {
      row.run(yp + r * g.OW * g.C, xp + (r / g.OH) * g.H * g.W * g.C, r % g.OH, 0, g.OW);
    }
  });
}

template <typename T>
void backward_input_nhwc(const at::Tensor& go, const at::Tensor& wt, at::Tensor& dx, const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  const int64_t Cp = wt.size(1);
  const T* gp = go.const_data_ptr<T>();
  T* dxp = dx.data_ptr<T>();
  const A* wp = wt.const_data_ptr<A>();
  // Stride 1: interior input columns have every kw on an output column, iw + pl - kw*dw in
  // [0, OW) for all kw: iw >= (KW-1)*dw - pl and iw + pl <= OW - 1.
  const bool unit = g.sw == 1;
  const int64_t iw_lo = unit ? std::min(g.W, std::max<int64_t>(0, (g.KW - 1) * g.dw - g.pl)) : g.W;
  const int64_t iw_hi = unit ? std::max(iw_lo, std::min(g.W, g.OW - g.pl)) : g.W;
  const bool row_block = unit && has_row_block(g.KW, 1, g.dw);
  std::vector<A> wflip;
  if (row_block) {
    wflip.resize(g.taps() * Cp);
    for (int64_t kh = 0; kh < g.KH; ++kh) {
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        std::memcpy(wflip.data() + (kh * g.KW + kw) * Cp, wp + (kh * g.KW + g.KW - 1 - kw) * Cp, sizeof(A) * Cp);
      }
    }
  }
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, g.W * g.C));
  at::parallel_for(0, g.N * g.H, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> off(g.taps()), tap(g.taps());
    std::vector<const T*> src(g.taps()), row_ptr(g.KH);
    std::vector<const A*> wrow_ptr(g.KH);
    std::vector<A> wsel;
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / g.H, ih = r % g.H;
      const T* gb = gp + n * g.OH * g.OW * g.C;
      T* dxrow = dxp + r * g.W * g.C;
      // The kh whose window puts row ih on an output row: (ih + pt - kh*dh) a multiple of sh in
      // [0, sh*OH).
      int64_t nkh = 0;
      int64_t khs[64], kws[64];
      const bool few = g.KH <= 64 && g.KW <= 64;
      auto pixel = [&](int64_t iw) {
        int64_t nt = 0;
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          const int64_t th = ih + g.pt - kh * g.dh;
          if (th < 0 || th % g.sh != 0 || th / g.sh >= g.OH) continue;
          const int64_t oh = th / g.sh;
          for (int64_t kw = 0; kw < g.KW; ++kw) {
            const int64_t tw = iw + g.pl - kw * g.dw;
            if (tw < 0 || tw % g.sw != 0 || tw / g.sw >= g.OW) continue;
            off[nt] = (oh * g.OW + tw / g.sw) * g.C;
            tap[nt++] = kh * g.KW + kw;
          }
        }
        nhwc_pixel<T>(dxrow + iw * g.C, gb, off.data(), tap.data(), nt, wp, Cp, nullptr, g.C);
      };
      int64_t iw = 0;
      if (unit && few && iw_hi - iw_lo >= 4) {
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          const int64_t th = ih + g.pt - kh * g.dh;
          if (th < 0 || th % g.sh != 0 || th / g.sh >= g.OH) continue;
          khs[nkh++] = kh;
        }
        // Weights of the valid (kh, all kw) taps, gathered once per row in block order.
        wsel.resize(std::max<int64_t>(1, nkh * g.KW) * Cp);
        for (int64_t i = 0; i < nkh; ++i) {
          std::memcpy(wsel.data() + i * g.KW * Cp, wp + khs[i] * g.KW * Cp, sizeof(A) * g.KW * Cp);
        }
        for (; iw < iw_lo; ++iw) pixel(iw);
        if (row_block) {
          // dx[iw] = sum_kw w[kw] g[iw + pl - kw] = sum_kw' wflip[kw'] g[iw + pl - (KW-1) + kw']:
          // the forward's row block on g with the kernel mirrored along w.
          constexpr int64_t P = row_block_pixels<1>();
          for (int64_t i = 0; i < nkh; ++i) wrow_ptr[i] = wflip.data() + khs[i] * g.KW * Cp;
          for (; iw + P <= iw_hi; iw += P) {
            for (int64_t i = 0; i < nkh; ++i) {
              const int64_t oh = (ih + g.pt - khs[i] * g.dh) / g.sh;
              row_ptr[i] = gb + (oh * g.OW + iw + g.pl - (g.KW - 1)) * g.C;
            }
            dispatch_row_block<T>(g.KW, 1, dxrow + iw * g.C, g.C, row_ptr.data(), wrow_ptr.data(), nkh, Cp, nullptr);
          }
        }
        for (; iw + 4 <= iw_hi; iw += 4) {
          int64_t t = 0;
          for (int64_t i = 0; i < nkh; ++i) {
            const T* grow = gb + ((ih + g.pt - khs[i] * g.dh) / g.sh) * g.OW * g.C;
            for (int64_t kw = 0; kw < g.KW; ++kw) src[t++] = grow + (iw + g.pl - kw * g.dw) * g.C;
          }
          nhwc_block4<T>(dxrow + iw * g.C, g.C, src.data(), g.C, nkh * g.KW, wsel.data(), Cp, nullptr, g.C);
        }
      }
      if (!unit && few) {
        // Strided: the input columns of one stride phase (iw = ph + sw*m) see the same kw taps, and
        // consecutive m read consecutive output columns, so four of them form one block.
        nkh = 0;
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          const int64_t th = ih + g.pt - kh * g.dh;
          if (th < 0 || th % g.sh != 0 || th / g.sh >= g.OH) continue;
          khs[nkh++] = kh;
        }
        for (int64_t ph = 0; ph < g.sw && ph < g.W; ++ph) {
          int64_t nkw = 0;
          for (int64_t kw = 0; kw < g.KW; ++kw) {
            if (((ph + g.pl - kw * g.dw) % g.sw + g.sw) % g.sw == 0) kws[nkw++] = kw;
          }
          const int64_t nt = nkh * nkw;
          wsel.resize(std::max<int64_t>(1, nt) * Cp);
          for (int64_t i = 0; i < nkh; ++i) {
            for (int64_t k = 0; k < nkw; ++k) {
              std::memcpy(wsel.data() + (i * nkw + k) * Cp, wp + (khs[i] * g.KW + kws[k]) * Cp, sizeof(A) * Cp);
            }
          }
          for (int64_t c0 = ph; c0 < g.W;) {
            const int64_t c3 = c0 + 3 * g.sw;
            const bool interior =
                nt > 0 && c3 < g.W && c0 + g.pl - kws[nkw - 1] * g.dw >= 0 && (c3 + g.pl - kws[0] * g.dw) / g.sw < g.OW;
            if (!interior) {
              pixel(c0);
              c0 += g.sw;
              continue;
            }
            int64_t t = 0;
            for (int64_t i = 0; i < nkh; ++i) {
              const T* grow = gb + ((ih + g.pt - khs[i] * g.dh) / g.sh) * g.OW * g.C;
              for (int64_t k = 0; k < nkw; ++k) src[t++] = grow + ((c0 + g.pl - kws[k] * g.dw) / g.sw) * g.C;
            }
            nhwc_block4<T>(dxrow + c0 * g.C, g.sw * g.C, src.data(), g.C, nt, wsel.data(), Cp, nullptr, g.C);
            c0 += 4 * g.sw;
          }
        }
        continue;
      }
      for (; iw < g.W; ++iw) pixel(iw);
    }
  });
}

// Output rows per weight-gradient item: a function of the shape only (never of the thread count),
// so the partition and with it every rounding is the same on every machine and every run.
int64_t wgrad_rows_per_item(const DepthwiseGeometry& g) {
  const int64_t total_rows = g.N * g.OH;
  const int64_t per_row = std::max<int64_t>(1, g.OW * g.C);
  int64_t rows = div_up(int64_t{1} << 16, per_row);                     // ~64K elements of g per item: L2-resident
  rows = std::min(rows, std::max<int64_t>(1, div_up(total_rows, 32)));  // at least ~32 items
  return std::max<int64_t>(1, rows);
}

// acc[j] += g[o] * x[o * xstep + j * tstep] over n output columns, NK taps in registers.
template <typename T, int NK, typename Load>
inline void wgrad_interior(OpmathVec<T>* acc, const T* g, const T* x, int64_t n, int64_t gstep, int64_t xstep,
                           int64_t tstep, const Load& load) {
  OpmathVec<T> a[NK];
  static_for<NK>([&](auto j) { a[j] = acc[j]; });
  for (int64_t o = 0; o < n; ++o) {
    const OpmathVec<T> gv = load(g + o * gstep);
    const T* xo = x + o * xstep;
    static_for<NK>([&](auto j) { a[j] = at::vec::fmadd(gv, load(xo + j * tstep), a[j]); });
  }
  static_for<NK>([&](auto j) { acc[j] = a[j]; });
}

// The same sums for column dilation 1 and column stride S, four output columns at a time: input
// vector u = j*S + k feeds tap k of column j, so 3*S + NK loads serve 4*NK FMAs. Each acc[k] still
// adds its terms in increasing output column, so the result is bitwise that of wgrad_interior.
template <typename T, int NK, int S, typename Load>
inline void wgrad_interior_reuse(OpmathVec<T>* acc, const T* g, const T* x, int64_t n, int64_t C, const Load& load) {
  constexpr int P = 4;
  constexpr int U = S * (P - 1) + NK;
  OpmathVec<T> a[NK];
  static_for<NK>([&](auto k) { a[k] = acc[k]; });
  int64_t o = 0;
  for (; o + P <= n; o += P) {
    OpmathVec<T> gv[P];
    static_for<P>([&](auto j) { gv[j] = load(g + (o + j) * C); });
    const T* xo = x + o * S * C;
    static_for<U>([&](auto u) {
      const OpmathVec<T> xv = load(xo + u * C);
      static_for<P>([&](auto j) {
        constexpr int k = decltype(u)::value - decltype(j)::value * S;
        if constexpr (k >= 0 && k < NK) a[k] = at::vec::fmadd(gv[j], xv, a[k]);
      });
    });
  }
  for (; o < n; ++o) {
    const OpmathVec<T> gv = load(g + o * C);
    const T* xo = x + o * S * C;
    static_for<NK>([&](auto k) { a[k] = at::vec::fmadd(gv, load(xo + k * C), a[k]); });
  }
  static_for<NK>([&](auto k) { acc[k] = a[k]; });
}

template <typename T>
void backward_weight_nhwc(const at::Tensor& go, const at::Tensor& x, at::Tensor& ws, const DepthwiseGeometry& g,
                          int64_t rows_per_item) {
  using A = opmath_t<T>;
  using V = at::vec::Vectorized<A>;
  constexpr int64_t L = V::size();
  constexpr int64_t G = 8;
  const int64_t Cp = ws.size(2);
  const int64_t items = ws.size(0);
  const int64_t taps = g.taps();
  const int64_t total_rows = g.N * g.OH;
  const T* xp = x.const_data_ptr<T>();
  const T* gp = go.const_data_ptr<T>();
  A* wsp = ws.data_ptr<A>();
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r0 = item * rows_per_item, r1 = std::min(total_rows, r0 + rows_per_item);
      A* out = wsp + item * (taps + 1) * Cp;
      for (int64_t c = 0; c < g.C; c += L) {
        const int64_t cnt = std::min(L, g.C - c);
        auto load = [&](const T* ptr) { return cnt == L ? load_opmath<T>(ptr) : load_opmath<T>(ptr, cnt); };
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          for (int64_t k0 = 0; k0 < g.KW; k0 += G) {
            const int64_t nk = std::min(G, g.KW - k0);
            // Output columns whose taps k0 .. k0+nk-1 all land inside the row.
            const int64_t ow_lo = std::min(g.OW, div_up(std::max<int64_t>(0, g.pl - k0 * g.dw), g.sw));
            const int64_t lastv = g.W - 1 + g.pl - (k0 + nk - 1) * g.dw;
            const int64_t ow_hi = std::max(ow_lo, std::min(g.OW, lastv >= 0 ? lastv / g.sw + 1 : 0));
            V acc[G];
            for (int64_t j = 0; j < G; ++j) acc[j] = V(A(0));
            for (int64_t r = r0; r < r1; ++r) {
              const int64_t n = r / g.OH, oh = r % g.OH;
              const int64_t ih = oh * g.sh + kh * g.dh - g.pt;
              if (ih < 0 || ih >= g.H) continue;
              const T* grow = gp + r * g.OW * g.C + c;
              const T* xrow = xp + ((n * g.H + ih) * g.W) * g.C + c;
              auto border = [&](int64_t ow) {
                const V gv = load(grow + ow * g.C);
                const int64_t iw0 = ow * g.sw + k0 * g.dw - g.pl;
                for (int64_t j = 0; j < nk; ++j) {
                  const int64_t iw = iw0 + j * g.dw;
                  if (iw >= 0 && iw < g.W) acc[j] = at::vec::fmadd(gv, load(xrow + iw * g.C), acc[j]);
                }
              };
              int64_t ow = 0;
              for (; ow < ow_lo; ++ow) border(ow);
              // Interior: every kw of the group in bounds; fixed trip counts for 3, 5 and 7 taps.
              const T* xs = xrow + (ow * g.sw + k0 * g.dw - g.pl) * g.C;
              const int64_t xstep = g.sw * g.C, tstep = g.dw * g.C;
              const int64_t ni = ow_hi - ow;
              const T* gi = grow + ow * g.C;
              const bool reuse = g.dw == 1 && (g.sw == 1 || g.sw == 2) && (nk == 3 || nk == 5 || nk == 7);
              if (reuse) {
                const bool s1 = g.sw == 1;
                if (nk == 3) {
                  s1 ? wgrad_interior_reuse<T, 3, 1>(acc, gi, xs, ni, g.C, load)
                     : wgrad_interior_reuse<T, 3, 2>(acc, gi, xs, ni, g.C, load);
                } else if (nk == 5) {
                  s1 ? wgrad_interior_reuse<T, 5, 1>(acc, gi, xs, ni, g.C, load)
                     : wgrad_interior_reuse<T, 5, 2>(acc, gi, xs, ni, g.C, load);
                } else {
                  s1 ? wgrad_interior_reuse<T, 7, 1>(acc, gi, xs, ni, g.C, load)
                     : wgrad_interior_reuse<T, 7, 2>(acc, gi, xs, ni, g.C, load);
                }
              } else
                switch (nk) {
                  case 3:
                    wgrad_interior<T, 3>(acc, grow + ow * g.C, xs, ow_hi - ow, g.C, xstep, tstep, load);
                    break;
                  case 5:
                    wgrad_interior<T, 5>(acc, grow + ow * g.C, xs, ow_hi - ow, g.C, xstep, tstep, load);
                    break;
                  case 7:
                    wgrad_interior<T, 7>(acc, grow + ow * g.C, xs, ow_hi - ow, g.C, xstep, tstep, load);
                    break;
                  default:
                    for (int64_t o = 0; o < ow_hi - ow; ++o) {
                      const V gv = load(grow + (ow + o) * g.C);
                      for (int64_t j = 0; j < nk; ++j)
                        acc[j] = at::vec::fmadd(gv, load(xs + o * xstep + j * tstep), acc[j]);
                    }
                }
              for (ow = ow_hi; ow < g.OW; ++ow) border(ow);
            }
            for (int64_t j = 0; j < nk; ++j) acc[j].store(out + (kh * g.KW + k0 + j) * Cp + c);
          }
        }
        V bacc(A(0));
        for (int64_t r = r0; r < r1; ++r) {
          const T* grow = gp + r * g.OW * g.C + c;
          for (int64_t ow = 0; ow < g.OW; ++ow) bacc = bacc + load(grow + ow * g.C);
        }
        bacc.store(out + taps * Cp + c);
      }
    }
  });
}

// ---- entry points ----------------------------------------------------------------------------------

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
    if (cl) {
      forward_nhwc<scalar_t>(x, w, b, y, g);
    } else {
      forward_nchw<scalar_t>(x, w, b, y, g);
    }
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
    if (channels_last) {
      backward_input_nhwc<scalar_t>(go, w, dx, g);
    } else {
      backward_input_nchw<scalar_t>(go, w, dx, g);
    }
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
  // Partial sums, added over dim 0 in order: NHWC (items, taps + 1, Cp), NCHW (N, C, taps + 1).
  at::Tensor ws;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_depthwise_wgrad_cpu", [&] {
    const auto acc = c10::CppTypeToScalarType<opmath_t<scalar_t>>::value;
    constexpr int64_t L = opmath_vec_size<scalar_t>();
    if (cl) {
      const int64_t rows = wgrad_rows_per_item(g);
      ws = at::empty({div_up(g.N * g.OH, rows), taps + 1, round_up(g.C, L)}, x.options().dtype(acc));
      backward_weight_nhwc<scalar_t>(go, x, ws, g, rows);
    } else {
      ws = at::empty({g.N, g.C, taps + 1}, x.options().dtype(acc));
      backward_weight_nchw<scalar_t>(go, x, ws, g);
    }
  });
  const at::Tensor sums = sum_rows_in_order(ws);
  // (C, taps + 1): each channel's tap sums, then its bias sum. NHWC sums are (taps + 1, Cp).
  const at::Tensor per_channel = cl ? sums.narrow(1, 0, g.C).t() : sums;
  dw.view({g.C, taps}).copy_(per_channel.narrow(1, 0, taps));
  db.copy_(per_channel.select(1, taps));
  return {dw, db};
}

}  // namespace
}  // namespace fastops::cpu

TORCH_LIBRARY_IMPL(fastops, CPU, m) {
  m.impl("depthwise_conv2d", &fastops::cpu::depthwise_conv2d);
  m.impl("depthwise_conv2d_backward_input", &fastops::cpu::depthwise_conv2d_backward_input);
  m.impl("depthwise_conv2d_backward_weight", &fastops::cpu::depthwise_conv2d_backward_weight);
}
