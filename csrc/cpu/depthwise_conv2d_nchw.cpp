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
// fp32 small maps take a channel-blocked path instead (blocked_conv, blocked_wgrad, use_blocked):
// one image and 16 (AVX-512) / 8 (AVX2) channels per task, transposed into a zero-padded tile with
// the channels innermost, so the taps vectorise over channels as in the NHWC kernels. Its input
// gradient at any stride is a stride-1 forward over grad_output spread out by the stride: (s*s - 1)
// of s*s products multiply an inserted zero, still faster than the phase planes on small maps.
//
// fp32 3x3 kernels go first to two paths that read the planes as they lie: on AVX-512, rows to 16
// wide (register_conv, register_wgrad: whole rows per vector, a tap is one two-source permute; stride
// 1 and, on rows over 8 wide, stride 2 for the forward and weight gradient); on AVX-512 and AVX2, rows
// over 16 wide (wide_conv, wide_wgrad: a tap is one unaligned load, masked at the row's edges, two
// and a permute at column stride 2; the stride-2 input gradient spreads a window of grad_output to
// the lanes of each column parity, wide_dgrad_s2).
//
// fp16/bf16 tensors take those fp32 paths through chunks of planes widened into fp32 buffers and
// narrowed back, where that beats the phase planes (half_through_fp32); fp64 runs the phase planes.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <fastops/cpu_reduce.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>
#include <fastops/depthwise_cpu.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace fastops::cpu {
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

// ---- channel-blocked small maps (fp32) -----------------------------------------------------------

// On small maps a plane is a few vectors long, so the plane-at-a-time gather spends its time on
// per-plane setup and partial rows. Here L channels at a time (L = fp32 lanes) are transposed into a
// zero-padded [Hp][Wp][L] tile (L1/L2-resident), the taps run vectorised over the channel lanes with
// P output pixels of a row in registers, and the [OH][OWp][L] result is transposed back into the NCHW
// planes: x and y cross memory once, in the caller's layout.
struct BlockedGeom {
  int64_t H, W, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl;
  int64_t P, OWp, Hp, Wp;  // pixels per register block, output row width rounded to P, tile size
  int64_t uh = 1, uw = 1;  // input pixel (i, j) goes to tile (i * uh + pt, j * uw + pl)
};

BlockedGeom blocked_geom(int64_t H, int64_t W, int64_t OH, int64_t OW, const DepthwiseGeometry& g, int64_t pt,
                         int64_t pl) {
  BlockedGeom b{H, W, OH, OW, g.KH, g.KW, g.sh, g.sw, g.dh, g.dw, pt, pl, 0, 0, 0, 0};
  b.P = OW % 7 == 0 ? 7 : 8;  // 7 wastes no computed-and-dropped pixel on 7/14/28/56-wide maps
  b.OWp = round_up(OW, b.P);
  b.Hp = (OH - 1) * g.sh + (g.KH - 1) * g.dh + 1;
  b.Wp = (b.OWp - 1) * g.sw + (g.KW - 1) * g.dw + 1;
  return b;
}

// The row kernel below exists for these: a K-wide kernel at column stride S, column dilation 1.
bool has_blocked_row(const DepthwiseGeometry& g) {
  return g.dw == 1 && (g.KW == 3 || g.KW == 5 || g.KW == 7) && (g.sw == 1 || g.sw == 2);
}

#if defined(CPU_CAPABILITY_AVX512)
// The 16x16 in-register transpose of ATen's transpose_block (from FBGEMM), with compile-time indices
// so the 16 rows stay in registers.
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  static_for_inlined<8>([&](auto i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  });
  static_for_inlined<4>([&](auto i) {
    const auto pd = [](__m512 v) { return _mm512_castps_pd(v); };
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * i]), pd(t[4 * i + 2])));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * i]), pd(t[4 * i + 2])));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * i + 1]), pd(t[4 * i + 3])));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * i + 1]), pd(t[4 * i + 3])));
  });
  static_for_inlined<2>([&](auto i) {
    static_for_inlined<4>([&](auto k) {
      t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
      t[8 * i + 4 + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0xdd);
    });
  });
  static_for_inlined<16>([&](auto i) {
    if constexpr (decltype(i)::value < 8) {
      r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    } else {
      r[i] = _mm512_shuffle_f32x4(t[i - 8], t[i], 0xdd);
    }
  });
}
#endif

// Input pixels [p0, p0 + m) of channels [c0, c0 + nc) (the planes at src, plane stride HW) into the
// tile: pixel p's L channel values go to tile + pos[p] * L (skipped where pos < 0). tmp: L*L floats.
inline void tile_in(const float* src, int64_t HW, int64_t nc, int64_t m, float* tile, const int64_t* pos, float* tmp) {
  constexpr int64_t L = at::vec::Vectorized<float>::size();
#if defined(CPU_CAPABILITY_AVX512)
  (void)tmp;
  __m512 r[16];
  if (m == L) {
    static_for_inlined<16>([&](auto i) { r[i] = i < nc ? _mm512_loadu_ps(src + i * HW) : _mm512_setzero_ps(); });
  } else {
    const auto lm = static_cast<__mmask16>((1u << m) - 1);
    static_for_inlined<16>(
        [&](auto i) { r[i] = i < nc ? _mm512_maskz_loadu_ps(lm, src + i * HW) : _mm512_setzero_ps(); });
  }
  transpose16(r);
  static_for_inlined<16>([&](auto j) {
    if (j < m && pos[j] >= 0) _mm512_storeu_ps(tile + pos[j] * L, r[j]);
  });
#else
  if (nc == L && m == L) {
    at::vec::transpose_mxn<float, L, L>(src, HW, tmp, L);
  } else {
    for (int64_t i = 0; i < nc; ++i) {
      for (int64_t j = 0; j < m; ++j) tmp[j * L + i] = src[i * HW + j];
    }
  }
  for (int64_t j = 0; j < m; ++j) {
    if (pos[j] >= 0) at::vec::Vectorized<float>::loadu(tmp + j * L).store(tile + pos[j] * L);
  }
#endif
}

// The inverse for the output: pixels [q0, q0 + m), read at out + pos[q] * L, into the nc planes at
// dst (plane stride OHW).
inline void tile_out(const float* out, const int64_t* pos, int64_t m, int64_t nc, float* dst, int64_t OHW, float* tmp) {
  constexpr int64_t L = at::vec::Vectorized<float>::size();
#if defined(CPU_CAPABILITY_AVX512)
  (void)tmp;
  __m512 r[16];
  static_for_inlined<16>([&](auto j) { r[j] = j < m ? _mm512_loadu_ps(out + pos[j] * L) : _mm512_setzero_ps(); });
  transpose16(r);
  if (m == L) {
    static_for_inlined<16>([&](auto i) {
      if (i < nc) _mm512_storeu_ps(dst + i * OHW, r[i]);
    });
  } else {
    const auto sm = static_cast<__mmask16>((1u << m) - 1);
    static_for_inlined<16>([&](auto i) {
      if (i < nc) _mm512_mask_storeu_ps(dst + i * OHW, sm, r[i]);
    });
  }
#else
  for (int64_t j = 0; j < m; ++j) at::vec::Vectorized<float>::loadu(out + pos[j] * L).store(tmp + j * L);
  if (nc == L && m == L) {
    at::vec::transpose_mxn<float, L, L>(tmp, L, dst, OHW);
  } else {
    for (int64_t j = 0; j < m; ++j) {
      for (int64_t i = 0; i < nc; ++i) dst[i * OHW + j] = tmp[j * L + i];
    }
  }
#endif
}

// One output row of the tile, P pixels at a time: out = init + sum over (kh, kw) of w * tile. Each
// tile vector of a kernel row is loaded once for every (pixel, kw) it feeds (S*(P-1) + K loads for
// P*K FMAs); every index is a compile-time constant, so acc and wv live in registers.
template <int K, int S, int P>
void blocked_row(float* out, const float* tile, const float* w, const float* init, const BlockedGeom& b, int64_t oh) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t L = V::size();
  constexpr int U = S * (P - 1) + K;
  const V vinit = init ? V::loadu(init) : V(0.f);
  for (int64_t ow0 = 0; ow0 < b.OWp; ow0 += P) {
    V acc[P];
    static_for_inlined<P>([&](auto j) { acc[j] = vinit; });
    for (int64_t kh = 0; kh < b.KH; ++kh) {
      const float* xr = tile + ((oh * b.sh + kh * b.dh) * b.Wp + ow0 * S) * L;
      V wv[K];
      static_for_inlined<K>([&](auto kw) { wv[kw] = V::loadu(w + (kh * K + kw) * L); });
      static_for_inlined<U>([&](auto u) {
        const V xv = V::loadu(xr + u * L);
        static_for_inlined<K>([&](auto kw) {
          constexpr int d = decltype(u)::value - decltype(kw)::value;
          if constexpr (d >= 0 && d % S == 0 && d / S < P) acc[d / S] = at::vec::fmadd(xv, wv[kw], acc[d / S]);
        });
      });
    }
    float* o = out + (oh * b.OWp + ow0) * L;
    static_for_inlined<P>([&](auto j) { acc[j].store(o + j * L); });
  }
}

template <int K, int S>
void blocked_rows_p(float* out, const float* tile, const float* w, const float* init, const BlockedGeom& b) {
  for (int64_t oh = 0; oh < b.OH; ++oh) {
    if (b.P == 7) {
      blocked_row<K, S, 7>(out, tile, w, init, b, oh);
    } else {
      blocked_row<K, S, 8>(out, tile, w, init, b, oh);
    }
  }
}

void blocked_rows(float* out, const float* tile, const float* w, const float* init, const BlockedGeom& b) {
#define FASTOPS_BLOCKED_ROWS(KK, SS)               \
  if (b.KW == KK && b.sw == SS) {                  \
    blocked_rows_p<KK, SS>(out, tile, w, init, b); \
    return;                                        \
  }
  FASTOPS_BLOCKED_ROWS(3, 1)
  FASTOPS_BLOCKED_ROWS(3, 2)
  FASTOPS_BLOCKED_ROWS(5, 1)
  FASTOPS_BLOCKED_ROWS(5, 2)
  FASTOPS_BLOCKED_ROWS(7, 1)
  FASTOPS_BLOCKED_ROWS(7, 2)
#undef FASTOPS_BLOCKED_ROWS
}

// y planes (N, C, OH, OW) from x planes (N, C, H, W); wt: (C/L blocks, taps, L), bias (C/L, L) or
// nullptr, both zero-padded to whole blocks.
void blocked_conv(float* yp, const float* xp, const float* wt, const float* bias, int64_t N, int64_t C,
                  const BlockedGeom& b) {
  constexpr int64_t L = at::vec::Vectorized<float>::size();
  const int64_t HW = b.H * b.W, OHW = b.OH * b.OW, taps = b.KH * b.KW, nb = div_up(C, L);
  // Where input pixel p lands in the tile (-1: cut off, never read), and where output pixel q sits
  // in the computed rows.
  std::vector<int64_t> xpos(HW), ypos(OHW);
  for (int64_t i = 0; i < b.H; ++i) {
    for (int64_t j = 0; j < b.W; ++j) {
      const int64_t r = i * b.uh + b.pt, c = j * b.uw + b.pl;
      xpos[i * b.W + j] = (r < b.Hp && c < b.Wp) ? r * b.Wp + c : -1;
    }
  }
  for (int64_t q = 0; q < OHW; ++q) ypos[q] = (q / b.OW) * b.OWp + q % b.OW;
  // An output larger than L2 is written with streaming stores from an L1 staging block (the block's nc
  // planes are contiguous in y): stored directly, the transposed rows land at plane-stride offsets,
  // split cache lines and first read each line from memory. Only where a block is whole cache lines
  // (always with 16 lanes; with 8, partial lines made AVX2's 7x7 maps slower).
  const bool stream = N * C * OHW * 4 > (1 << 20) && (L * OHW * 4) % 64 == 0;
  at::parallel_for(0, N * nb, 1, [&](int64_t begin, int64_t end) {
    // The tile's padding is never written, so zeroing once per task covers every block.
    std::vector<float> tile(b.Hp * b.Wp * L + L, 0.f), out(b.OH * b.OWp * L), tmp(L * L);
    std::vector<float> stage(stream ? L * OHW : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / nb, blk = task % nb, c0 = blk * L, nc = std::min(L, C - c0);
      const float* xs = xp + (n * C + c0) * HW;
      for (int64_t p0 = 0; p0 < HW; p0 += L) {
        tile_in(xs + p0, HW, nc, std::min(L, HW - p0), tile.data(), xpos.data() + p0, tmp.data());
      }
      const float* w = wt + blk * taps * L;
      const float* init = bias ? bias + blk * L : nullptr;
      blocked_rows(out.data(), tile.data(), w, init, b);
      float* ys = yp + (n * C + c0) * OHW;
      float* dst = stream ? stage.data() : ys;
      for (int64_t q0 = 0; q0 < OHW; q0 += L) {
        tile_out(out.data(), ypos.data() + q0, std::min(L, OHW - q0), nc, dst + q0, OHW, tmp.data());
      }
      if (stream) stream_copy(ys, stage.data(), nc * OHW);
    }
    stream_fence();
  });
}

// Weight gradient of one channel block, one kernel row: sums[kw] += g[oh, ow] * tile[oh*sh + kh*dh,
// ow*S + kw] over the plane, R interleaved sets of accumulators (pixel parity) so that a 3-wide row
// still has 6 independent FMA chains.
template <int K, int S>
void blocked_wgrad_row(float* sums, const float* tile, const float* gt, const BlockedGeom& b, int64_t kh) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t L = V::size();
  constexpr int R = K <= 3 ? 2 : 1;
  V acc[R][K];
  static_for_inlined<R>([&](auto r) { static_for_inlined<K>([&](auto kw) { acc[r][kw] = V(0.f); }); });
  for (int64_t oh = 0; oh < b.OH; ++oh) {
    const float* xr = tile + (oh * b.sh + kh * b.dh) * b.Wp * L;
    const float* gr = gt + oh * b.OW * L;
    int64_t ow = 0;
    for (; ow + R <= b.OW; ow += R) {
      static_for_inlined<R>([&](auto r) {
        const V gv = V::loadu(gr + (ow + r) * L);
        const float* x = xr + (ow + r) * S * L;
        static_for_inlined<K>([&](auto kw) { acc[r][kw] = at::vec::fmadd(gv, V::loadu(x + kw * L), acc[r][kw]); });
      });
    }
    for (; ow < b.OW; ++ow) {
      const V gv = V::loadu(gr + ow * L);
      static_for_inlined<K>(
          [&](auto kw) { acc[0][kw] = at::vec::fmadd(gv, V::loadu(xr + (ow * S + kw) * L), acc[0][kw]); });
    }
  }
  static_for_inlined<K>([&](auto kw) {
    V a = acc[0][kw];
    static_for_inlined<R - 1>([&](auto r) { a = a + acc[r + 1][kw]; });
    a.store(sums + kw * L);
  });
}

// The same for a whole 3x3 kernel at once: the 9 tap sums stay in registers (9 independent chains)
// and two neighbouring pixels share their overlapping tile vectors: 2 + 3*(S + 3) loads for 18 FMAs
// (the row-at-a-time loop above loads 4 per 3).
template <int S>
void blocked_wgrad_3x3(float* sums, const float* tile, const float* gt, const BlockedGeom& b) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t L = V::size();
  constexpr int U = S + 3;
  V acc[3][3];
  static_for_inlined<3>([&](auto r) { static_for_inlined<3>([&](auto kw) { acc[r][kw] = V(0.f); }); });
  for (int64_t oh = 0; oh < b.OH; ++oh) {
    const float* gr = gt + oh * b.OW * L;
    const float* xr[3];
    static_for_inlined<3>([&](auto r) { xr[r] = tile + (oh * b.sh + r * b.dh) * b.Wp * L; });
    int64_t ow = 0;
    for (; ow + 2 <= b.OW; ow += 2) {
      const V g0 = V::loadu(gr + ow * L), g1 = V::loadu(gr + (ow + 1) * L);
      static_for_inlined<3>([&](auto r) {
        const float* x = xr[r] + ow * S * L;
        static_for_inlined<U>([&](auto u) {
          const V xv = V::loadu(x + u * L);
          static_for_inlined<3>([&](auto kw) {
            constexpr int d0 = decltype(u)::value - decltype(kw)::value;
            if constexpr (d0 == 0) acc[r][kw] = at::vec::fmadd(g0, xv, acc[r][kw]);
            if constexpr (d0 == S) acc[r][kw] = at::vec::fmadd(g1, xv, acc[r][kw]);
          });
        });
      });
    }
    for (; ow < b.OW; ++ow) {
      const V g0 = V::loadu(gr + ow * L);
      static_for_inlined<3>([&](auto r) {
        static_for_inlined<3>(
            [&](auto kw) { acc[r][kw] = at::vec::fmadd(g0, V::loadu(xr[r] + (ow * S + kw) * L), acc[r][kw]); });
      });
    }
  }
  static_for_inlined<3>(
      [&](auto r) { static_for_inlined<3>([&](auto kw) { acc[r][kw].store(sums + (r * 3 + kw) * L); }); });
}

// The weight gradient's partial sums of the (n, channel block) planes: ws (N, C, taps + 1) as the
// plane path writes them, the last slot the bias gradient.
void blocked_wgrad(float* ws, const float* xp, const float* gp, int64_t N, int64_t C, const BlockedGeom& b) {
  using V = at::vec::Vectorized<float>;
  constexpr int64_t L = V::size();
  const int64_t HW = b.H * b.W, OHW = b.OH * b.OW, taps = b.KH * b.KW, nb = div_up(C, L);
  std::vector<int64_t> xpos(HW), gpos(OHW);
  for (int64_t i = 0; i < b.H; ++i) {
    for (int64_t j = 0; j < b.W; ++j) {
      const int64_t r = i + b.pt, c = j + b.pl;
      xpos[i * b.W + j] = (r < b.Hp && c < b.Wp) ? r * b.Wp + c : -1;
    }
  }
  for (int64_t q = 0; q < OHW; ++q) gpos[q] = q;
  at::parallel_for(0, N * nb, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> tile(b.Hp * b.Wp * L + L, 0.f), gt(OHW * L + L), sums((taps + 1) * L), tmp(L * L);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / nb, blk = task % nb, c0 = blk * L, nc = std::min(L, C - c0);
      const float* xs = xp + (n * C + c0) * HW;
      const float* gs = gp + (n * C + c0) * OHW;
      for (int64_t p0 = 0; p0 < HW; p0 += L) {
        tile_in(xs + p0, HW, nc, std::min(L, HW - p0), tile.data(), xpos.data() + p0, tmp.data());
      }
      for (int64_t q0 = 0; q0 < OHW; q0 += L) {
        tile_in(gs + q0, OHW, nc, std::min(L, OHW - q0), gt.data(), gpos.data() + q0, tmp.data());
      }
      const bool whole3x3 = b.KH == 3 && b.KW == 3;
      if (whole3x3 && b.sw == 1) blocked_wgrad_3x3<1>(sums.data(), tile.data(), gt.data(), b);
      if (whole3x3 && b.sw == 2) blocked_wgrad_3x3<2>(sums.data(), tile.data(), gt.data(), b);
      for (int64_t kh = 0; kh < (whole3x3 ? 0 : b.KH); ++kh) {
        float* sk = sums.data() + kh * b.KW * L;
        if (b.KW == 3 && b.sw == 1) blocked_wgrad_row<3, 1>(sk, tile.data(), gt.data(), b, kh);
        if (b.KW == 3 && b.sw == 2) blocked_wgrad_row<3, 2>(sk, tile.data(), gt.data(), b, kh);
        if (b.KW == 5 && b.sw == 1) blocked_wgrad_row<5, 1>(sk, tile.data(), gt.data(), b, kh);
        if (b.KW == 5 && b.sw == 2) blocked_wgrad_row<5, 2>(sk, tile.data(), gt.data(), b, kh);
        if (b.KW == 7 && b.sw == 1) blocked_wgrad_row<7, 1>(sk, tile.data(), gt.data(), b, kh);
        if (b.KW == 7 && b.sw == 2) blocked_wgrad_row<7, 2>(sk, tile.data(), gt.data(), b, kh);
      }
      V bs(0.f);
      for (int64_t q = 0; q < OHW; ++q) bs = bs + V::loadu(gt.data() + q * L);
      bs.store(sums.data() + taps * L);
      for (int64_t l = 0; l < nc; ++l) {
        float* o = ws + (n * C + c0 + l) * (taps + 1);
        for (int64_t t = 0; t <= taps; ++t) o[t] = sums[t * L + l];
      }
    }
  });
}

// (C, taps) weights -> (C/L blocks, taps, L), zero-padded; flip reverses the taps (the input
// gradient is a forward over grad_output with the kernel turned 180 degrees).
std::vector<float> blocked_weights(const float* w, int64_t C, int64_t taps, bool flip) {
  constexpr int64_t L = at::vec::Vectorized<float>::size();
  std::vector<float> wt(div_up(C, L) * taps * L, 0.f);
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t t = 0; t < taps; ++t) wt[((c / L) * taps + t) * L + c % L] = w[c * taps + (flip ? taps - 1 - t : t)];
  }
  return wt;
}

// Where the blocked path beats the plane path (thread-time A/B, git show 00da02d:benchmarks/results/
// depthwise_conv2d_cpu_nchw_blocked.md): the two transposes cost about 0.5 shuffle per element, which
// 3x3 stride-1 maps wider than 16 do not recover (20x20 3.5-4.1 ms plane, 4.9 blocked; 28x28 equal);
// 5x5 and wider kernels, strided rows and maps to 16 wide gain (3x3 training, 8x8 to 16x16 maps:
// 1.05-2.4x faster than the plane path on AVX-512, 1.2-2.3x on AVX2). The tile and the computed
// rows must fit in L2.
bool use_blocked(const DepthwiseGeometry& g, const BlockedGeom& b) {
  constexpr int64_t L = at::vec::Vectorized<float>::size();
  if (!has_blocked_row(g) || (b.Hp * b.Wp + b.OH * b.OWp) * L * 4 > (512 << 10)) return false;
  return g.KW > 3 || g.sw > 1 || b.OW <= 16;
}

// a / b rounded down (b > 0).
inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// The forward's (and the weight gradient's) tap offsets into x, or the input gradient's into
// grad_output: output (i, j) reads source (i + c, j + e) at stride 1 (the two paths below).
std::vector<std::pair<int64_t, int64_t>> tap_offsets(const DepthwiseGeometry& g, bool dgrad) {
  std::vector<std::pair<int64_t, int64_t>> offsets;
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const int64_t c = kh * g.dh - g.pt, e = kw * g.dw - g.pl;
      offsets.emplace_back(dgrad ? -c : c, dgrad ? -e : e);
    }
  }
  return offsets;
}

// ---- small planes in registers (fp32, AVX-512) --------------------------------------------------
// Rows at most 16 wide: a vector holds R = 16 / W whole rows, and the plane's vectors are contiguous
// runs of its NCHW storage (R*W elements; the last one zero-filled), so they load and store without a
// transpose. At stride 1, with output rows as wide as the input's, output (i, j) reads source
// (i + c, j + e) for each tap's offsets (c, e); for every lane of output vector k that source lies in
// vector k + floor(c / R) or the one after. A tap is then one two-source permute (VPERMT2PS, zero
// where the column leaves the plane) and one FMA per 16 outputs: no per-row setup and no transposes,
// which is what the phase planes (per-plane setup, partial rows) and the channel-blocked path (two
// transposes of ~0.5 shuffle per element) pay on maps of 4x4 to 16x16. Vectors outside the plane
// are zero, so the rows past its edges read zeros. The forward, the input gradient (the offsets
// negated) and the weight gradient (the forward's reads of x times grad_output) share one plan. At
// stride 2 a vector holds one input row and up to two output rows, whose sources are then two input
// vectors that need not be neighbours (off, off2).
#if defined(CPU_CAPABILITY_AVX512)
struct RegisterTap {
  std::array<int32_t, 16> idx;  // lane of the pair (first vector: 0-15, second: 16-31)
  int64_t off, off2;            // the pair's vectors, relative to the output vector's first source
  __mmask16 inside;             // lanes whose source column lies in the plane
  bool plain;                   // every lane reads its own lane of the first vector: no permute
};

struct RegisterPlan {
  int64_t src_lanes, dst_lanes;      // elements per vector: rows per vector * row width
  int64_t src_hw, dst_hw;            // plane sizes
  int64_t src_vectors, dst_vectors;  // vectors per plane
  int64_t step;                      // output vector k's first source vector is k * step (+ off)
  int64_t first, span;               // buffer slot 0 holds source vector `first` (<= 0); slots in all
  std::vector<RegisterTap> taps;
};

// Plans dst (dst_h x dst_w, dst_rows rows a vector) from src (src_h x src_w, src_rows rows a vector),
// tap t reading source (sh * i + offsets[t].first, sw * j + offsets[t].second) for output (i, j).
// The rows of one output vector must reach at most two source vectors (true at stride 1 with
// src_rows == dst_rows, and with one source row a vector and dst_rows <= 2).
RegisterPlan register_plan(int64_t src_h, int64_t src_w, int64_t src_rows, int64_t dst_h, int64_t dst_w,
                           int64_t dst_rows, int64_t sh, int64_t sw,
                           const std::vector<std::pair<int64_t, int64_t>>& offsets) {
  RegisterPlan p;
  p.src_lanes = src_rows * src_w;
  p.dst_lanes = dst_rows * dst_w;
  p.src_hw = src_h * src_w;
  p.dst_hw = dst_h * dst_w;
  p.src_vectors = div_up(src_h, src_rows);
  p.dst_vectors = div_up(dst_h, dst_rows);
  TORCH_INTERNAL_ASSERT((sh * dst_rows) % src_rows == 0);
  p.step = sh * dst_rows / src_rows;
  int64_t lo = 0, hi = p.src_vectors;
  for (const auto& [c, e] : offsets) {
    RegisterTap t{};
    // Output row r of a vector reads source row sh * r + c past the vector's first: vector
    // floor((sh * r + c) / src_rows).
    t.off = floor_div(c, src_rows);
    t.off2 = std::max(floor_div(sh * (dst_rows - 1) + c, src_rows), t.off + 1);
    uint32_t inside = 0;
    for (int64_t l = 0; l < p.dst_lanes; ++l) {
      const int64_t row = sh * (l / dst_w) + c, v = floor_div(row, src_rows);
      TORCH_INTERNAL_ASSERT(v == t.off || v == t.off2);
      const int64_t col = sw * (l % dst_w) + e;
      t.idx[l] = static_cast<int32_t>((v == t.off ? 0 : 16) + (row - v * src_rows) * src_w +
                                      std::clamp<int64_t>(col, 0, src_w - 1));
      if (col >= 0 && col < src_w) inside |= 1u << l;
    }
    t.inside = static_cast<__mmask16>(inside);
    t.plain = true;
    for (int64_t l = 0; l < p.dst_lanes; ++l) t.plain = t.plain && t.idx[l] == l && ((inside >> l) & 1);
    lo = std::min(lo, t.off);
    hi = std::max(hi, (p.dst_vectors - 1) * p.step + t.off2 + 1);
    p.taps.push_back(t);
  }
  p.first = lo;
  p.span = hi - lo;
  return p;
}

// The lanes of source / output vector v: all of a vector's, fewer in the plane's last.
inline __mmask16 lanes_of(int64_t lanes, int64_t hw, int64_t v) {
  return static_cast<__mmask16>((1u << std::clamp<int64_t>(hw - v * lanes, 0, lanes)) - 1);
}
inline __mmask16 src_lanes(const RegisterPlan& p, int64_t v) { return lanes_of(p.src_lanes, p.src_hw, v); }
inline __mmask16 dst_lanes(const RegisterPlan& p, int64_t v) { return lanes_of(p.dst_lanes, p.dst_hw, v); }

// The store mask of output vector v: all 16 lanes where they lie inside the plane (the lanes past the
// vector's own land in the next vector of the plane, which every caller stores after this one), else
// the vector's lanes. Masked stores, even of all 16 lanes, stream at about half the rate of plain ones
// on Zen 5 (a standalone loop; the stride-2 input gradient ran 2.5x faster without them).
inline __mmask16 store_lanes(const RegisterPlan& p, int64_t v) {
  return v * p.dst_lanes + 16 <= p.dst_hw ? __mmask16{0xFFFF} : dst_lanes(p, v);
}

C10_ALWAYS_INLINE void store_vector(float* out, __mmask16 lanes, __m512 v) {
  if (lanes == 0xFFFF) {
    _mm512_storeu_ps(out, v);
  } else {
    _mm512_mask_storeu_ps(out, lanes, v);
  }
}

// The vector at p, zero outside `lanes`: a plain load zeroed in registers where its 16 floats lie
// before end (the tensor's end), a masked load only at the very end. Streaming from memory, a partly
// masked load took 2-2.5x a plain one's time on Zen 5, and was 56% of the 14x14 forward's time there.
C10_ALWAYS_INLINE __m512 load_lanes(const float* p, __mmask16 lanes, const float* end) {
  if (p + 16 > end) return _mm512_maskz_loadu_ps(lanes, p);
  __m512 v = _mm512_loadu_ps(p);
  asm("" : "+v"(v));  // else GCC folds the load and the zeroing back into one masked load
  return _mm512_maskz_mov_ps(lanes, v);
}

// slots[v - first] = source vector v: the plane's vectors, zero outside (the zeros are written by
// the caller once per task; this rewrites only the plane's slots). end: the end of src's tensor.
inline void load_register_plane(__m512* slots, const float* src, const RegisterPlan& p, const float* end) {
  for (int64_t v = 0; v < p.src_vectors; ++v) {
    slots[v - p.first] = load_lanes(src + v * p.src_lanes, src_lanes(p, v), end);
  }
}

// The tap for the output vector whose first source vector (k * step) is at `at` (lanes past the
// vector's are never stored or summed, so a plain tap may leave them unmasked).
C10_ALWAYS_INLINE __m512 register_tap(const __m512* at, const RegisterTap& t, const __m512i idx) {
  if (t.plain) return at[t.off];
  return _mm512_maskz_permutex2var_ps(t.inside, at[t.off], idx, at[t.off2]);
}

// Four output vectors at once (four independent FMA chains; one chain of taps per vector waits on the
// FMA latency). Vector u's taps read base[u] + off and + off2, with weights wc[u]; the first m are stored. The
// accumulators are named variables: as an array GCC kept them on the stack, a store and a reload per
// tap, which tripled the time.
C10_ALWAYS_INLINE void register_vectors(float* const* out, const __m512* const* base, const float* const* wc,
                                        const float* init, const __mmask16* store, int64_t m, const RegisterPlan& p) {
  __m512 acc0 = _mm512_set1_ps(init[0]), acc1 = _mm512_set1_ps(init[1]), acc2 = _mm512_set1_ps(init[2]),
         acc3 = _mm512_set1_ps(init[3]);
  const __m512 *b0 = base[0], *b1 = base[1], *b2 = base[2], *b3 = base[3];
  const float *w0 = wc[0], *w1 = wc[1], *w2 = wc[2], *w3 = wc[3];
  const int64_t taps = static_cast<int64_t>(p.taps.size());
  for (int64_t t = 0; t < taps; ++t) {
    const RegisterTap& tap = p.taps[t];
    const int64_t o = tap.off, o2 = tap.off2;
    if (tap.plain) {
      acc0 = _mm512_fmadd_ps(b0[o], _mm512_set1_ps(w0[t]), acc0);
      acc1 = _mm512_fmadd_ps(b1[o], _mm512_set1_ps(w1[t]), acc1);
      acc2 = _mm512_fmadd_ps(b2[o], _mm512_set1_ps(w2[t]), acc2);
      acc3 = _mm512_fmadd_ps(b3[o], _mm512_set1_ps(w3[t]), acc3);
    } else {
      const __m512i idx = _mm512_loadu_si512(tap.idx.data());
      const __mmask16 k = tap.inside;
      acc0 = _mm512_fmadd_ps(_mm512_maskz_permutex2var_ps(k, b0[o], idx, b0[o2]), _mm512_set1_ps(w0[t]), acc0);
      acc1 = _mm512_fmadd_ps(_mm512_maskz_permutex2var_ps(k, b1[o], idx, b1[o2]), _mm512_set1_ps(w1[t]), acc1);
      acc2 = _mm512_fmadd_ps(_mm512_maskz_permutex2var_ps(k, b2[o], idx, b2[o2]), _mm512_set1_ps(w2[t]), acc2);
      acc3 = _mm512_fmadd_ps(_mm512_maskz_permutex2var_ps(k, b3[o], idx, b3[o2]), _mm512_set1_ps(w3[t]), acc3);
    }
  }
  store_vector(out[0], store[0], acc0);
  if (m > 1) store_vector(out[1], store[1], acc1);
  if (m > 2) store_vector(out[2], store[2], acc2);
  if (m > 3) store_vector(out[3], store[3], acc3);
}

// Planes of V <= 4 vectors whose taps read only vectors k - 1 and k (off -1 or 0; e.g. 3x3 on maps to
// 8 wide): 4 / V planes at once with every vector in a register and zeros around them, no buffer.
// Four output vectors, four chains; the accumulators are indexed by compile-time constants only.
template <int V>
C10_ALWAYS_INLINE void register_resident(float* const* out, const float* const* in, const float* const* wc,
                                         const float* init, const RegisterPlan& p, const float* end) {
  constexpr int P = 4 / V;
  const __m512 zero = _mm512_setzero_ps();
  __m512 x[P * V], acc[P * V];
  static_for_inlined<P * V>([&](auto j) {
    constexpr int i = j / V, v = j % V;
    x[j] = load_lanes(in[i] + v * p.src_lanes, src_lanes(p, v), end);
    acc[j] = _mm512_set1_ps(init[i]);
  });
  const int64_t taps = static_cast<int64_t>(p.taps.size());
  for (int64_t t = 0; t < taps; ++t) {
    const RegisterTap& tap = p.taps[t];
    const __m512i idx = _mm512_loadu_si512(tap.idx.data());
    const __mmask16 k = tap.inside;
    if (tap.plain && tap.off == 0) {  // (a plain tap at off -1 reads vector k - 1: the permute below)
      static_for_inlined<P * V>([&](auto j) { acc[j] = _mm512_fmadd_ps(x[j], _mm512_set1_ps(wc[j / V][t]), acc[j]); });
    } else if (tap.off == 0) {
      static_for_inlined<P * V>([&](auto j) {
        constexpr int v = j % V;
        const __m512 hi = v + 1 < V ? x[(j + 1) % (P * V)] : zero;
        acc[j] = _mm512_fmadd_ps(_mm512_maskz_permutex2var_ps(k, x[j], idx, hi), _mm512_set1_ps(wc[j / V][t]), acc[j]);
      });
    } else {
      static_for_inlined<P * V>([&](auto j) {
        constexpr int v = j % V;
        const __m512 lo = v > 0 ? x[(j + P * V - 1) % (P * V)] : zero;
        acc[j] = _mm512_fmadd_ps(_mm512_maskz_permutex2var_ps(k, lo, idx, x[j]), _mm512_set1_ps(wc[j / V][t]), acc[j]);
      });
    }
  }
  static_for_inlined<P * V>([&](auto j) {
    constexpr int i = j / V, v = j % V;
    store_vector(out[i] + v * p.dst_lanes, store_lanes(p, v), acc[j]);
  });
}

// dst planes = init[c] + sum_t w[c, t] * tap t of the src planes; planes in (n, c) order. Output
// vectors run 4 at a time: those of one plane where it has 4 or more (one set of weights), else the
// vectors of a group of planes.
void register_conv(float* dst, const float* src, const float* w, const float* init, int64_t planes, int64_t C,
                   const RegisterPlan& p) {
  constexpr int64_t kChains = 4;
  const int64_t taps = static_cast<int64_t>(p.taps.size());
  const int64_t V = p.dst_vectors;
  const int64_t group = V >= kChains ? 1 : div_up(kChains, V);  // planes per group
  const int64_t grain = std::max<int64_t>(group, round_up(div_up(4096, std::max<int64_t>(p.dst_hw, 1)), group));
  // Planes for register_resident.
  bool resident = (V == 1 || V == 2 || V == 4) && p.src_vectors == V && p.step == 1;
  for (const RegisterTap& t : p.taps) resident = resident && (t.off == 0 || t.off == -1) && t.off2 == t.off + 1;
  const int64_t per_call = kChains / V;  // planes per register_resident call
  const float* src_end = src + planes * p.src_hw;
  at::parallel_for(0, planes, grain, [&](int64_t begin, int64_t end) {
    std::vector<__m512> buf(group * p.span, _mm512_setzero_ps());
    float* out[kChains];
    const __m512* base[kChains];  // the output vector's slot: its taps read base + off
    const float* wc[kChains];
    float b[kChains];
    __mmask16 store[kChains];
    int64_t c = begin % C;
    // Fills entry u for plane `plane` (channel c), and steps c.
    const auto set_plane = [&](int64_t u, int64_t plane) {
      out[u] = dst + plane * p.dst_hw;
      wc[u] = w + c * taps;
      b[u] = init ? init[c] : 0.f;
      c = c + 1 == C ? 0 : c + 1;
    };
    int64_t plane = begin;
    if (resident) {
      const float* in[kChains];
      for (; plane + per_call <= end; plane += per_call) {
        for (int64_t u = 0; u < per_call; ++u) {
          set_plane(u, plane + u);
          in[u] = src + (plane + u) * p.src_hw;
        }
        if (V == 1) register_resident<1>(out, in, wc, b, p, src_end);
        if (V == 2) register_resident<2>(out, in, wc, b, p, src_end);
        if (V == 4) register_resident<4>(out, in, wc, b, p, src_end);
      }
    }
    if (group == 1) {
      for (; plane < end; ++plane) {
        load_register_plane(buf.data(), src + plane * p.src_hw, p, src_end);
        const __m512* slots = buf.data();
        set_plane(0, plane);
        float* y = out[0];
        for (int64_t u = 1; u < kChains; ++u) {
          wc[u] = wc[0];
          b[u] = b[0];
        }
        for (int64_t k = 0; k < V; k += kChains) {
          const int64_t m = std::min(kChains, V - k);
          for (int64_t u = 0; u < kChains; ++u) {
            const int64_t ku = k + std::min(u, m - 1);
            out[u] = y + ku * p.dst_lanes;
            base[u] = slots + (ku * p.step - p.first);
            store[u] = store_lanes(p, ku);
          }
          register_vectors(out, base, wc, b, store, m, p);
        }
      }
      return;
    }
    while (plane < end) {
      const int64_t count = std::min(group, end - plane);
      int64_t m = 0;
      for (int64_t i = 0; i < count; ++i, ++plane) {
        load_register_plane(buf.data() + i * p.span, src + plane * p.src_hw, p, src_end);
        const int64_t ci = c;
        c = c + 1 == C ? 0 : c + 1;
        for (int64_t k = 0; k < V; ++k) {
          out[m] = dst + plane * p.dst_hw + k * p.dst_lanes;
          base[m] = buf.data() + i * p.span + (k * p.step - p.first);
          wc[m] = w + ci * taps;
          b[m] = init ? init[ci] : 0.f;
          store[m] = store_lanes(p, k);
          if (++m == kChains) {
            register_vectors(out, base, wc, b, store, m, p);
            m = 0;
          }
        }
      }
      if (m > 0) {
        for (int64_t u = m; u < kChains; ++u) {  // spare chains repeat entry 0 and are not stored
          base[u] = base[0];
          wc[u] = wc[0];
          b[u] = b[0];
        }
        register_vectors(out, base, wc, b, store, m, p);
      }
    }
  });
}

// The 16 vectors' lane sums in one vector, by a transposing tree (45 instructions against ~8 per
// vector reduced alone); lane l holds the sum of v[reduced_lane_source()[l]].
inline __m512 reduce16(const __m512 (&v)[16]) {
  __m512 s8[8], s4[4], s2[2];
  static_for_inlined<8>([&](auto i) {
    const __m512 a = v[2 * i], b = v[2 * i + 1];
    s8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  });
  static_for_inlined<4>([&](auto i) {
    const __m512 a = s8[2 * i], b = s8[2 * i + 1];
    s4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
  });
  static_for_inlined<2>([&](auto i) {
    const __m512 a = s4[2 * i], b = s4[2 * i + 1];
    s2[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
  });
  return _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], 0x88), _mm512_shuffle_ps(s2[0], s2[1], 0xDD));
}

// Which input vector each lane of reduce16's result sums (found once by reducing v[i] = i).
inline const std::array<int32_t, 16>& reduced_lane_source() {
  static const std::array<int32_t, 16> source = [] {
    __m512 v[16];
    for (int i = 0; i < 16; ++i) v[i] = _mm512_set1_ps(static_cast<float>(i));
    alignas(64) float r[16];
    _mm512_store_ps(r, reduce16(v));
    std::array<int32_t, 16> s{};
    for (int l = 0; l < 16; ++l) s[l] = static_cast<int32_t>(r[l] / 16.f);
    return s;
  }();
  return source;
}

// out[0, count) = the lane sums of acc[0, count), 16 vectors reduced at a time (acc holds count
// rounded up to 16 vectors).
inline void store_lane_sums(float* out, const __m512* acc, int64_t count) {
  const std::array<int32_t, 16>& source = reduced_lane_source();
  for (int64_t s0 = 0; s0 < count; s0 += 16) {
    alignas(64) float r[16];
    _mm512_store_ps(r, reduce16(*reinterpret_cast<const __m512(*)[16]>(acc + s0)));
    for (int l = 0; l < 16; ++l) {
      if (s0 + source[l] < count) out[s0 + source[l]] = r[l];
    }
  }
}

// Images per weight-gradient partial: each (block of images, channel) accumulates its planes lane-wise
// and reduces once, so the reduction of the tap sums (a 16-vector tree and a scatter, more than a 4x4
// plane's FMAs) is paid once per 8 planes. The blocks depend on N alone: bitwise repeatable.
constexpr int64_t kWgradImages = 8;

// The weight gradient of planes held in registers (register_resident's planes: V <= 4 vectors, taps
// reading vectors k - 1 and k) with 9 taps (3x3), for the images [n0, n1) of channel c: no buffer, and
// the 10 sums in registers.
template <int V>
void register_wgrad_resident3x3(float* out, const float* x, const float* go, int64_t n0, int64_t n1, int64_t c,
                                int64_t C, const RegisterPlan& p, const float* x_end, const float* go_end) {
  const __m512 zero = _mm512_setzero_ps();
  __m512i idx[9];
  static_for_inlined<9>([&](auto t) { idx[t] = _mm512_loadu_si512(p.taps[t].idx.data()); });
  __m512 acc[16];
  static_for_inlined<16>([&](auto t) { acc[t] = zero; });
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t plane = n * C + c;
    __m512 xv[V], g[V];
    static_for_inlined<V>([&](auto v) {
      xv[v] = load_lanes(x + plane * p.src_hw + v * p.src_lanes, src_lanes(p, v), x_end);
      g[v] = load_lanes(go + plane * p.dst_hw + v * p.dst_lanes, dst_lanes(p, v), go_end);
      acc[9] = _mm512_add_ps(acc[9], g[v]);
    });
    static_for_inlined<9>([&](auto t) {
      const RegisterTap& tap = p.taps[t];
      static_for_inlined<V>([&](auto v) {
        const __m512 lo = tap.off == 0 ? xv[v] : (v > 0 ? xv[(v + V - 1) % V] : zero);
        const __m512 hi = tap.off == 0 ? (v + 1 < V ? xv[(v + 1) % V] : zero) : xv[v];
        acc[t] = _mm512_fmadd_ps(g[v], _mm512_maskz_permutex2var_ps(tap.inside, lo, idx[t], hi), acc[t]);
      });
    });
  }
  store_lane_sums(out, acc, 10);
}

// ws (ceil(N / kWgradImages), C, taps + 1): per block of images and channel, each tap's sum of g * x
// at that tap, then the sum of g. Taps run 4 at a time (4 independent chains over a plane's vectors).
void register_wgrad(float* ws, const float* x, const float* go, int64_t N, int64_t C, const RegisterPlan& p) {
  constexpr int64_t kChains = 4;
  const int64_t taps = static_cast<int64_t>(p.taps.size());
  const int64_t sums = round_up(taps + 1, 16);
  const int64_t blocks = div_up(N, kWgradImages);
  const int64_t grain = std::max<int64_t>(1, div_up(4096, std::max<int64_t>(p.dst_hw * kWgradImages, 1)));
  const int64_t V = p.dst_vectors;
  bool resident3x3 = taps == 9 && (V == 1 || V == 2 || V == 4) && p.src_vectors == V && p.step == 1;
  for (const RegisterTap& t : p.taps) {
    resident3x3 = resident3x3 && (t.off == 0 || t.off == -1) && t.off2 == t.off + 1;
  }
  const float *x_end = x + N * C * p.src_hw, *go_end = go + N * C * p.dst_hw;
  at::parallel_for(0, blocks * C, grain, [&](int64_t begin, int64_t end) {
    std::vector<__m512> buf(p.span, _mm512_setzero_ps()), gv(p.dst_vectors), acc(sums);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t block = task / C, c = task % C;
      const int64_t n0 = block * kWgradImages, n1 = std::min(N, n0 + kWgradImages);
      if (resident3x3) {
        float* out = ws + task * (taps + 1);
        if (p.dst_vectors == 1) register_wgrad_resident3x3<1>(out, x, go, n0, n1, c, C, p, x_end, go_end);
        if (p.dst_vectors == 2) register_wgrad_resident3x3<2>(out, x, go, n0, n1, c, C, p, x_end, go_end);
        if (p.dst_vectors == 4) register_wgrad_resident3x3<4>(out, x, go, n0, n1, c, C, p, x_end, go_end);
        continue;
      }
      std::fill(acc.begin(), acc.end(), _mm512_setzero_ps());
      for (int64_t n = n0; n < n1; ++n) {
        const int64_t plane = n * C + c;
        load_register_plane(buf.data(), x + plane * p.src_hw, p, x_end);
        const float* gp = go + plane * p.dst_hw;
        __m512 gsum = acc[taps];
        for (int64_t k = 0; k < p.dst_vectors; ++k) {
          gv[k] = load_lanes(gp + k * p.dst_lanes, dst_lanes(p, k), go_end);
          gsum = _mm512_add_ps(gsum, gv[k]);
        }
        acc[taps] = gsum;
        int64_t t0 = 0;
        for (; t0 + kChains <= taps; t0 += kChains) {
          // Named accumulators (as an array GCC kept them on the stack).
          const RegisterTap &q0 = p.taps[t0], &q1 = p.taps[t0 + 1], &q2 = p.taps[t0 + 2], &q3 = p.taps[t0 + 3];
          const __m512i i0 = _mm512_loadu_si512(q0.idx.data()), i1 = _mm512_loadu_si512(q1.idx.data()),
                        i2 = _mm512_loadu_si512(q2.idx.data()), i3 = _mm512_loadu_si512(q3.idx.data());
          __m512 a0 = acc[t0], a1 = acc[t0 + 1], a2 = acc[t0 + 2], a3 = acc[t0 + 3];
          for (int64_t k = 0; k < p.dst_vectors; ++k) {
            const __m512* at = buf.data() + (k * p.step - p.first);
            const __m512 g = gv[k];
            a0 = _mm512_fmadd_ps(g, register_tap(at, q0, i0), a0);
            a1 = _mm512_fmadd_ps(g, register_tap(at, q1, i1), a1);
            a2 = _mm512_fmadd_ps(g, register_tap(at, q2, i2), a2);
            a3 = _mm512_fmadd_ps(g, register_tap(at, q3, i3), a3);
          }
          acc[t0] = a0;
          acc[t0 + 1] = a1;
          acc[t0 + 2] = a2;
          acc[t0 + 3] = a3;
        }
        for (; t0 < taps; ++t0) {
          __m512 a = acc[t0];
          const RegisterTap& tap = p.taps[t0];
          const __m512i idx = _mm512_loadu_si512(tap.idx.data());
          for (int64_t k = 0; k < p.dst_vectors; ++k) {
            a = _mm512_fmadd_ps(gv[k], register_tap(buf.data() + (k * p.step - p.first), tap, idx), a);
          }
          acc[t0] = a;
        }
      }
      store_lane_sums(ws + task * (taps + 1), acc.data(), taps + 1);
    }
  });
}
#endif

#if defined(CPU_CAPABILITY_AVX512)
// Where the register path applies and beats the others (thread-time A/B,
// git show 00da02d:benchmarks/results/depthwise_conv2d_cpu_nchw_register.md): rows to 16 wide, at stride 1 with output
// rows as wide as the input's 3x3 kernels in every pass (1.2-2.4x faster), wider kernels only in the
// weight gradient of rows over 8 wide (14x14 5x5 1.4x, 7x7 1.1-1.2x), since a permute per tap loses
// to the channel-blocked rows' loads shared across the kernel row (forward 1.6-2.4x slower); at stride
// 2 (either direction) 3x3 kernels on rows over 8 wide in the forward and weight gradient (1.3-1.8x;
// on 8-wide rows, half-empty vectors made 64x64x8x8 1.2x slower; the input gradient is a scatter).
bool use_register_plane(const DepthwiseGeometry& g, bool weight_gradient) {
  if (g.W > 16 || g.OW > 16) return false;
  const bool k3 = g.KH <= 3 && g.KW <= 3;
  if (g.sh == 1 && g.sw == 1) return g.OW == g.W && (k3 || (weight_gradient && g.W > 8));
  return k3 && g.sh <= 2 && g.sw <= 2 && g.W > 8;
}

// The plan of the forward and the weight gradient (src x, dst the output plane) or of the stride-1
// input gradient (src grad_output, dst dx). Stride 1: 16 / W rows a vector on both sides; strided:
// one input row a vector and up to two output rows, so that an output vector reaches two input
// vectors.
RegisterPlan register_conv_plan(const DepthwiseGeometry& g, bool dgrad) {
  const auto offsets = tap_offsets(g, dgrad);
  if (g.sh == 1 && g.sw == 1) {
    const int64_t rows = 16 / g.W;
    return dgrad ? register_plan(g.OH, g.OW, rows, g.H, g.W, rows, 1, 1, offsets)
                 : register_plan(g.H, g.W, rows, g.OH, g.OW, rows, 1, 1, offsets);
  }
  TORCH_INTERNAL_ASSERT(!dgrad);
  return register_plan(g.H, g.W, 1, g.OH, g.OW, std::min<int64_t>(16 / g.OW, 2), g.sh, g.sw, offsets);
}
#endif

// The three passes, for the choice of path.
enum class Pass { kForward, kInputGradient, kWeightGradient };

// ---- rows over 16 wide (fp32, AVX-512 and AVX2, 3x3) ----------------------------------------
// A row of OW > 16 outputs is Q = ceil(OW / L) vectors (L = 16 lanes on AVX-512, 8 on AVX2). Tap
// (c, e) of output vector (i, q) reads input row sh * i + c from column sw * L q + e: at stride 1 one
// unaligned load from the plane as it lies, at column stride 2 two loads and a permute to the even
// lanes, then one FMA. No copy into padded phase planes and no computed-and-dropped columns, which is
// what the plane path pays. Kernel rows outside the plane are skipped (the top and bottom output rows
// run fewer taps); the vectors of a row whose every tap reads whole input vectors run four at a time
// from one pointer with plain loads; the others (a row's edges) load each tap masked to the columns
// inside the row, with a plain load where that mask is whole; a whole vector takes a plain store.
// On the Zen 5 host of this work, streaming from memory, a partly masked AVX-512 load or any
// VMASKMOVPS took 2-2.5x a plain load's time, and a masked AVX-512 store, even of all 16 lanes, twice
// a plain store's (standalone loops; masked loads on every tap ran the path 2-4x slower, masked stores
// the stride-2 input gradient 2.5x; git show 00da02d:benchmarks/results/depthwise_conv2d_cpu_nchw_wide_avx2.md). The
// input gradient takes the path at stride 1, and at stride 2 as wide_dgrad_s2.
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#if defined(CPU_CAPABILITY_AVX512)
// The vector operations of the wide-row kernels, for the build's ISA.
struct WideIsa {
  static constexpr int64_t kLanes = 16;
  using Vec = __m512;
  using Mask = __mmask16;
  static Mask mask(uint32_t lanes) { return static_cast<__mmask16>(lanes); }
  // A whole mask takes a plain load or store (as the register path's store_vector).
  static Vec load(const Mask& m, const float* p) {
    return m == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
  }
  static Vec load_whole(const float* p) { return _mm512_loadu_ps(p); }
  static void store_whole(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static void store(float* p, const Mask& m, Vec v) { store_vector(p, m, v); }
  static Vec even_lanes(Vec lo, Vec hi) {  // lanes 0, 2, ..., 30 of lo:hi
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(lo, even, hi);
  }
  struct Gather {  // lane l = v[idx[l]] where keep has lane l, else 0
    __m512i idx;
    __mmask16 keep;
  };
  static Gather gather_of(const int32_t* idx, uint32_t keep) {
    return {_mm512_loadu_si512(idx), static_cast<__mmask16>(keep)};
  }
  static Vec gather(const Gather& g, Vec v) { return _mm512_maskz_permutexvar_ps(g.keep, g.idx, v); }
  static Vec broadcast(float v) { return _mm512_set1_ps(v); }
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static void store_sums(float* out, const Vec* acc, int64_t count) { store_lane_sums(out, acc, count); }
};
#else
struct WideIsa {
  static constexpr int64_t kLanes = 8;
  using Vec = __m256;
  struct Mask {  // VMASKMOVPS's mask: a lane is read / written where its sign bit is set
    alignas(32) std::array<int32_t, 8> lane;
    bool whole;  // every lane: a plain load or store
  };
  static Mask mask(uint32_t lanes) {
    Mask m;
    for (int l = 0; l < 8; ++l) m.lane[l] = (lanes >> l) & 1 ? -1 : 0;
    m.whole = lanes == 0xFF;
    return m;
  }
  static __m256i bits(const Mask& m) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(m.lane.data())); }
  static Vec load(const Mask& m, const float* p) {
    return m.whole ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, bits(m));
  }
  static Vec load_whole(const float* p) { return _mm256_loadu_ps(p); }
  static void store_whole(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  // VMASKMOVPS stores are slow on AMD: a whole vector takes a plain store.
  static void store(float* p, const Mask& m, Vec v) {
    if (m.whole) {
      _mm256_storeu_ps(p, v);
    } else {
      _mm256_maskstore_ps(p, bits(m), v);
    }
  }
  static Vec even_lanes(Vec lo, Vec hi) {  // lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6, then the 64-bit pairs reordered
    const __m256 s = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
  }
  struct Gather {  // lane l = v[idx[l]] where keep has lane l, else 0
    __m256i idx;
    __m256 keep;
  };
  static Gather gather_of(const int32_t* idx, uint32_t keep) {
    Mask m = mask(keep);
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx)), _mm256_castsi256_ps(bits(m))};
  }
  static Vec gather(const Gather& g, Vec v) { return _mm256_and_ps(_mm256_permutevar8x32_ps(v, g.idx), g.keep); }
  static Vec broadcast(float v) { return _mm256_set1_ps(v); }
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
  // Each sum in a fixed order (lanes pairwise, then the halves): bitwise repeatable.
  static void store_sums(float* out, const Vec* acc, int64_t count) {
    for (int64_t s = 0; s < count; ++s) {
      const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[s]), _mm256_extractf128_ps(acc[s], 1));
      const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
      out[s] = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
    }
  }
};
#endif

// A plane's plan: which kernel rows each output row reaches inside the plane, and how a
// row's output vectors split between a run of whole vectors (every tap reads whole input vectors:
// plain loads, four vectors from one pointer) and the rest (the row's edges and what is left of the
// run: masked loads). Kernel rows outside the plane are skipped, not masked.
struct WidePlan {
  int64_t src_hw, dst_hw, src_w, dst_w, dst_h, Q, sh, sw;
  std::vector<int64_t> tap_off;                    // c * src_w + e, kernel-row major, 3 taps a row
  std::vector<std::pair<int64_t, int64_t>> krows;  // (dst row): the kernel rows [kh0, kh1) inside the plane
  int64_t run_q0 = 0, run_n = 0;                   // whole vectors [run_q0, run_q0 + run_n), run_n a multiple of 4
  std::vector<int64_t> other_q;                    // the row's other vectors
  std::vector<WideIsa::Mask> masks;                // (q, tap, 2 loads): the columns each load reads
  std::vector<WideIsa::Mask> row_lanes;            // (q): the lanes of a row's vector q
};

WidePlan wide_plan(int64_t src_h, int64_t src_w, int64_t dst_h, int64_t dst_w, int64_t sh, int64_t sw,
                   const std::vector<std::pair<int64_t, int64_t>>& offsets) {
  constexpr int64_t L = WideIsa::kLanes, taps = 9;
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(offsets.size()) == taps);
  WidePlan p;
  p.src_hw = src_h * src_w;
  p.dst_hw = dst_h * dst_w;
  p.src_w = src_w;
  p.dst_w = dst_w;
  p.dst_h = dst_h;
  p.Q = div_up(dst_w, L);
  p.sh = sh;
  p.sw = sw;
  for (const auto& [c, e] : offsets) p.tap_off.push_back(c * src_w + e);
  for (int64_t i = 0; i < dst_h; ++i) {
    int64_t kh0 = 3, kh1 = 0;
    for (int64_t kh = 0; kh < 3; ++kh) {
      const int64_t row = sh * i + offsets[kh * 3].first;
      if (row >= 0 && row < src_h) kh0 = std::min(kh0, kh), kh1 = kh + 1;
    }
    p.krows.emplace_back(std::min(kh0, kh1), kh1);
  }
  const uint32_t all = (1u << L) - 1;
  std::vector<bool> whole(p.Q, true);
  for (int64_t q = 0; q < p.Q; ++q) {
    for (int64_t t = 0; t < taps; ++t) {
      const int64_t e = offsets[t].second;
      for (int64_t half = 0; half < 2; ++half) {
        uint32_t m = 0;
        for (int64_t l = 0; l < L; ++l) {
          const int64_t col = sw * L * q + L * half + l + e;  // the input column lane l loads
          // Stride 1: lanes past the row's outputs are not stored, but must not read the next row.
          const bool used = sw == 2 || L * q + l < dst_w;
          if (used && col >= 0 && col < src_w) m |= 1u << l;
        }
        p.masks.push_back(WideIsa::mask(m));
        if (half < sw && m != all) whole[q] = false;
      }
    }
    p.row_lanes.push_back(WideIsa::mask((1u << std::min<int64_t>(L, dst_w - L * q)) - 1));
    if (L * (q + 1) > dst_w) whole[q] = false;
  }
  // The first run of whole vectors, in fours.
  const int64_t qa = std::find(whole.begin(), whole.end(), true) - whole.begin();
  const int64_t qb = std::find(whole.begin() + qa, whole.end(), false) - whole.begin();
  p.run_q0 = qa;
  p.run_n = (qb - qa) / 4 * 4;
  for (int64_t q = 0; q < p.Q; ++q) {
    if (q < p.run_q0 || q >= p.run_q0 + p.run_n) p.other_q.push_back(q);
  }
  return p;
}

// The tap of an output vector whose tap input starts at x: plain loads in the run (kMasked false),
// masked loads for the other vectors (mk: this tap's two masks).
template <int64_t kColumnStride, bool kMasked>
C10_ALWAYS_INLINE WideIsa::Vec wide_tap(const float* x, const WideIsa::Mask* mk) {
  const auto load = [&](int64_t half) {
    if constexpr (kMasked) {
      return WideIsa::load(mk[half], x + half * WideIsa::kLanes);
    } else {
      return WideIsa::load_whole(x + half * WideIsa::kLanes);
    }
  };
  if constexpr (kColumnStride == 1) {
    return load(0);
  } else {
    return WideIsa::even_lanes(load(0), load(1));
  }
}

// The run of one output row: y = init + sum over the taps [t0, t1) of w[t] * tap t, four whole
// vectors at a time from one pointer (named accumulators, as in register_vectors).
template <int64_t kColumnStride>
C10_ALWAYS_INLINE void wide_conv_run(float* yr, const float* xr, const float* wc, WideIsa::Vec b, int64_t t0,
                                     int64_t t1, const WidePlan& p) {
  using Vec = WideIsa::Vec;
  constexpr int64_t L = WideIsa::kLanes, V = kColumnStride * L;  // input advance per output vector
  for (int64_t j = 0; j < p.run_n; j += 4) {
    const float* x0 = xr + (p.run_q0 + j) * V;
    float* y0 = yr + (p.run_q0 + j) * L;
    Vec a0 = b, a1 = b, a2 = b, a3 = b;
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = x0 + p.tap_off[t];
      const Vec wv = WideIsa::broadcast(wc[t]);
      a0 = WideIsa::fmadd(wide_tap<kColumnStride, false>(xt, nullptr), wv, a0);
      a1 = WideIsa::fmadd(wide_tap<kColumnStride, false>(xt + V, nullptr), wv, a1);
      a2 = WideIsa::fmadd(wide_tap<kColumnStride, false>(xt + 2 * V, nullptr), wv, a2);
      a3 = WideIsa::fmadd(wide_tap<kColumnStride, false>(xt + 3 * V, nullptr), wv, a3);
    }
    WideIsa::store_whole(y0, a0);
    WideIsa::store_whole(y0 + L, a1);
    WideIsa::store_whole(y0 + 2 * L, a2);
    WideIsa::store_whole(y0 + 3 * L, a3);
  }
}

// m <= 4 of the other output vectors, (row i, vector q) each, over the taps [t0, t1): masked loads,
// one accumulator chain each (spare chains repeat the last vector and are not stored). Each vector
// has a source and a mask pointer; the taps advance both by offsets shared by the four.
template <int64_t kColumnStride>
C10_ALWAYS_INLINE void wide_conv_others(float* ys, const float* xs, const float* wc, WideIsa::Vec b,
                                        const std::array<std::pair<int64_t, int64_t>, 4>& iq, int64_t m, int64_t t0,
                                        int64_t t1, const WidePlan& p) {
  using Vec = WideIsa::Vec;
  using Mask = WideIsa::Mask;
  constexpr int64_t L = WideIsa::kLanes, V = kColumnStride * L;
  const float *x0, *x1, *x2, *x3;
  const Mask *k0, *k1, *k2, *k3;
  const auto source = [&](int64_t u, const float*& x, const Mask*& k) {
    const auto [i, q] = iq[std::min(u, m - 1)];
    x = xs + p.sh * i * p.src_w + q * V;
    k = p.masks.data() + q * 18;
  };
  source(0, x0, k0);
  source(1, x1, k1);
  source(2, x2, k2);
  source(3, x3, k3);
  Vec a0 = b, a1 = b, a2 = b, a3 = b;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t off = p.tap_off[t], mt = 2 * t;
    const Vec wv = WideIsa::broadcast(wc[t]);
    a0 = WideIsa::fmadd(wide_tap<kColumnStride, true>(x0 + off, k0 + mt), wv, a0);
    a1 = WideIsa::fmadd(wide_tap<kColumnStride, true>(x1 + off, k1 + mt), wv, a1);
    a2 = WideIsa::fmadd(wide_tap<kColumnStride, true>(x2 + off, k2 + mt), wv, a2);
    a3 = WideIsa::fmadd(wide_tap<kColumnStride, true>(x3 + off, k3 + mt), wv, a3);
  }
  const auto store = [&](int64_t u, Vec a) {
    const auto [i, q] = iq[u];
    WideIsa::store(ys + i * p.dst_w + q * L, p.row_lanes[q], a);
  };
  store(0, a0);
  if (m > 1) store(1, a1);
  if (m > 2) store(2, a2);
  if (m > 3) store(3, a3);
}

// dst planes = init[c] + sum_t w[c, t] * tap t of the src planes, 3x3. The rows whose kernel rows all
// lie inside the plane share their other vectors' groups of four across rows (a row has 2-4 of them:
// per row, spare chains wasted up to half the work on 14-28 wide maps); the few rows at the top and
// bottom edges (fewer taps) go row by row.
template <int64_t kColumnStride>
void wide_conv(float* dst, const float* src, const float* w, const float* init, int64_t planes, int64_t C,
               const WidePlan& p) {
  const int64_t others = static_cast<int64_t>(p.other_q.size());
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    std::array<std::pair<int64_t, int64_t>, 4> iq;
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t c = plane % C;
      const float* xs = src + plane * p.src_hw;
      float* ys = dst + plane * p.dst_hw;
      const float* wc = w + c * 9;
      const WideIsa::Vec b = WideIsa::broadcast(init ? init[c] : 0.f);
      int64_t pending = 0;  // interior rows' other vectors gathered into iq
      for (int64_t i = 0; i < p.dst_h; ++i) {
        const auto [kh0, kh1] = p.krows[i];
        wide_conv_run<kColumnStride>(ys + i * p.dst_w, xs + p.sh * i * p.src_w, wc, b, 3 * kh0, 3 * kh1, p);
        const bool interior = kh0 == 0 && kh1 == 3;
        for (int64_t k0 = 0; !interior && k0 < others; k0 += 4) {
          const int64_t m = std::min<int64_t>(4, others - k0);
          std::array<std::pair<int64_t, int64_t>, 4> row;
          for (int64_t u = 0; u < m; ++u) row[u] = {i, p.other_q[k0 + u]};
          wide_conv_others<kColumnStride>(ys, xs, wc, b, row, m, 3 * kh0, 3 * kh1, p);
        }
        for (int64_t k = 0; interior && k < others; ++k) {
          iq[pending++] = {i, p.other_q[k]};
          if (pending == 4) {
            wide_conv_others<kColumnStride>(ys, xs, wc, b, iq, 4, 0, 9, p);
            pending = 0;
          }
        }
      }
      if (pending > 0) wide_conv_others<kColumnStride>(ys, xs, wc, b, iq, pending, 0, 9, p);
    }
  });
}

// One output vector's share of the weight gradient, into acc: the taps' sums of g * x over the kernel
// rows [kh0, kh1) (compile-time tap indices: the 9 sums stay in registers), then the sum of g.
template <int64_t kColumnStride, bool kMasked>
C10_ALWAYS_INLINE void wide_wgrad_vector(WideIsa::Vec (&acc)[16], const float* x, WideIsa::Vec g,
                                         const WideIsa::Mask* mk, int64_t kh0, int64_t kh1, const WidePlan& p) {
  static_for_inlined<3>([&](auto kh) {
    if (kh >= kh0 && kh < kh1) {
      static_for_inlined<3>([&](auto kw) {
        constexpr int64_t t = 3 * kh + kw;
        acc[t] = WideIsa::fmadd(g, wide_tap<kColumnStride, kMasked>(x + p.tap_off[t], mk + 2 * t), acc[t]);
      });
    }
  });
  acc[9] = WideIsa::add(acc[9], g);
}

// ws (planes, 10): per plane, the 9 taps' sums of g * x, then the sum of g, reduced once per plane.
// The lane sums of every ~16 output vectors are added into plane totals: a lane's chain on a 64x64
// plane was 512 products long on AVX2 and missed the tolerance of the float64 comparison.
template <int64_t kColumnStride>
void wide_wgrad(float* ws, const float* x, const float* go, int64_t planes, const WidePlan& p) {
  using Vec = WideIsa::Vec;
  constexpr int64_t L = WideIsa::kLanes, V = kColumnStride * L;
  const int64_t chunk_rows = std::max<int64_t>(1, 16 / p.Q);
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      Vec acc[16], total[16];  // store_sums reduces 16 at a time on AVX-512
      static_for_inlined<16>([&](auto t) { total[t] = WideIsa::zero(); });
      for (int64_t i0 = 0; i0 < p.dst_h; i0 += chunk_rows) {
        static_for_inlined<10>([&](auto t) { acc[t] = WideIsa::zero(); });
        for (int64_t i = i0; i < std::min(p.dst_h, i0 + chunk_rows); ++i) {
          const auto [kh0, kh1] = p.krows[i];
          const float* xr = x + plane * p.src_hw + p.sh * i * p.src_w;
          const float* gr = go + plane * p.dst_hw + i * p.dst_w;
          for (int64_t q = p.run_q0; q < p.run_q0 + p.run_n; ++q) {
            wide_wgrad_vector<kColumnStride, false>(acc, xr + q * V, WideIsa::load_whole(gr + q * L), nullptr, kh0, kh1,
                                                    p);
          }
          for (const int64_t q : p.other_q) {
            wide_wgrad_vector<kColumnStride, true>(acc, xr + q * V, WideIsa::load(p.row_lanes[q], gr + q * L),
                                                   p.masks.data() + q * 18, kh0, kh1, p);
          }
        }
        static_for_inlined<10>([&](auto t) { total[t] = WideIsa::add(total[t], acc[t]); });
      }
      WideIsa::store_sums(ws + plane * 10, total, 10);
    }
  });
}

// The input gradient at stride 2 (3x3, dilation 1, padding to 2): dx(i, j) = sum of w(kh, kw) *
// g((i + pt - kh) / 2, (j + pl - kw) / 2) over the taps whose numerators are even. A dx row reads one
// or two grad_output rows (kernel rows of the row's parity); a vector of L dx columns reads a window of
// L grad_output columns of each, whose lanes each kernel column spreads to the dx lanes of its parity
// with one in-register permute (zero elsewhere). The window is a plain load where it lies inside the
// row, masked at the row's ends. This replaces the zero-spread forward (three of four products
// multiply an inserted zero) and the phase planes.
struct WideDgradPlan {
  int64_t Q;                                // dx vectors a row
  std::vector<int64_t> window;              // (q): the window's first grad_output column
  std::vector<WideIsa::Mask> window_lanes;  // (q): its columns inside the row
  std::vector<WideIsa::Mask> row_lanes;     // (q): the dx lanes of vector q
  std::array<WideIsa::Gather, 3> spread;    // (kw): window lanes to dx lanes
};

WideDgradPlan wide_dgrad_plan(const DepthwiseGeometry& g) {
  constexpr int64_t L = WideIsa::kLanes;
  WideDgradPlan p;
  p.Q = div_up(g.W, L);
  const int64_t first = floor_div(g.pl - 2, 2);  // the window's first column, relative to j0 / 2
  for (int64_t q = 0; q < p.Q; ++q) {
    const int64_t c0 = q * L / 2 + first;
    uint32_t inside = 0;
    for (int64_t l = 0; l < L; ++l) inside |= (c0 + l >= 0 && c0 + l < g.OW ? 1u : 0u) << l;
    p.window.push_back(c0);
    p.window_lanes.push_back(WideIsa::mask(inside));
    p.row_lanes.push_back(WideIsa::mask((1u << std::min<int64_t>(L, g.W - L * q)) - 1));
  }
  for (int64_t kw = 0; kw < 3; ++kw) {
    std::array<int32_t, 16> idx{};
    uint32_t keep = 0;
    for (int64_t l = 0; l < L; ++l) {
      const int64_t num = g.pl + l - kw;  // (j0 even)
      if (num % 2 != 0) continue;
      idx[l] = static_cast<int32_t>(floor_div(num, 2) - first);
      TORCH_INTERNAL_ASSERT(idx[l] >= 0 && idx[l] < L);
      keep |= 1u << l;
    }
    p.spread[kw] = WideIsa::gather_of(idx.data(), keep);
  }
  return p;
}

void wide_dgrad_s2(float* dx, const float* go, const float* w, const DepthwiseGeometry& g) {
  using Vec = WideIsa::Vec;
  constexpr int64_t L = WideIsa::kLanes;
  const WideDgradPlan p = wide_dgrad_plan(g);
  const int64_t planes = g.N * g.C, ohw = g.OH * g.OW, hw = g.H * g.W;
  at::parallel_for(0, planes, 1, [&](int64_t begin, int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      const float* gs = go + plane * ohw;
      float* xs = dx + plane * hw;
      const float* wc = w + (plane % g.C) * 9;
      for (int64_t i = 0; i < g.H; ++i) {
        // The kernel rows of this row's parity whose grad_output row is inside the plane.
        int64_t kh_list[2], rows[2], nk = 0;
        for (int64_t kh = (i + g.pt) % 2; kh < 3; kh += 2) {
          const int64_t r = (i + g.pt - kh) / 2;
          if (i + g.pt - kh >= 0 && r < g.OH) kh_list[nk] = kh, rows[nk++] = r;
        }
        float* xr = xs + i * g.W;
        for (int64_t q0 = 0; q0 < p.Q; q0 += 4) {
          const int64_t m = std::min<int64_t>(4, p.Q - q0);
          Vec acc[4] = {WideIsa::zero(), WideIsa::zero(), WideIsa::zero(), WideIsa::zero()};
          for (int64_t k = 0; k < nk; ++k) {
            const float* gr = gs + rows[k] * g.OW;
            const float* wk = wc + 3 * kh_list[k];
            const Vec w0 = WideIsa::broadcast(wk[0]), w1 = WideIsa::broadcast(wk[1]), w2 = WideIsa::broadcast(wk[2]);
            static_for_inlined<4>([&](auto u) {
              const int64_t q = q0 + std::min<int64_t>(u, m - 1);  // spares repeat the last
              const Vec win = WideIsa::load(p.window_lanes[q], gr + p.window[q]);
              acc[u] = WideIsa::fmadd(WideIsa::gather(p.spread[0], win), w0, acc[u]);
              acc[u] = WideIsa::fmadd(WideIsa::gather(p.spread[1], win), w1, acc[u]);
              acc[u] = WideIsa::fmadd(WideIsa::gather(p.spread[2], win), w2, acc[u]);
            });
          }
          static_for_inlined<4>([&](auto u) {
            if (u < m) WideIsa::store(xr + (q0 + u) * L, p.row_lanes[q0 + u], acc[u]);
          });
        }
      }
    }
  });
}

// Where the wide-row path runs: 3x3 kernels on input rows over 16 wide; at stride 1 with output rows
// as wide as the input's; at stride 2 (rows, columns or both) for the forward and weight gradient, and
// (2, 2) for the input gradient.
bool use_wide_rows(const DepthwiseGeometry& g, Pass pass) {
  if (g.KH != 3 || g.KW != 3 || g.W <= 16) return false;
  if (g.sh == 1 && g.sw == 1) {
    // AVX2's stride-1 forward and input gradient gain only with runs of whole vectors (48 wide and
    // over); on 20x20 to 40x40 they lost 10-30% to the phase planes (input gradient: 20x20 0.63 ms
    // phase planes against 0.76 wide, 28x28 3.2 against 4.0, 40x40 2.9 against 3.5; 56x56 10.2
    // against 7.1; git show 00da02d:benchmarks/results/depthwise_conv2d_cpu_nchw_half.md).
    return g.OW == g.W && (WideIsa::kLanes == 16 || pass == Pass::kWeightGradient || g.OW >= 48);
  }
  if (pass == Pass::kInputGradient) {
    return g.sh == 2 && g.sw == 2 && g.dh == 1 && g.dw == 1 && g.pt <= 2 && g.pl <= 2;  // wide_dgrad_s2
  }
  return g.sh <= 2 && g.sw <= 2;
}

WidePlan wide_conv_plan(const DepthwiseGeometry& g, bool dgrad) {
  const auto offsets = tap_offsets(g, dgrad);
  return dgrad ? wide_plan(g.OH, g.OW, g.H, g.W, 1, 1, offsets) : wide_plan(g.H, g.W, g.OH, g.OW, g.sh, g.sw, offsets);
}

// The wide-row passes.
void wide_forward(float* y, const float* x, const float* w, const float* bias, const DepthwiseGeometry& g) {
  const WidePlan plan = wide_conv_plan(g, false);
  if (g.sw == 1) wide_conv<1>(y, x, w, bias, g.N * g.C, g.C, plan);
  if (g.sw == 2) wide_conv<2>(y, x, w, bias, g.N * g.C, g.C, plan);
}

void wide_input_gradient(float* dx, const float* go, const float* w, const DepthwiseGeometry& g) {
  if (g.sh == 2) {
    wide_dgrad_s2(dx, go, w, g);
    return;
  }
  wide_conv<1>(dx, go, w, nullptr, g.N * g.C, g.C, wide_conv_plan(g, true));
}

void wide_weight_sums(float* ws, const float* x, const float* go, const DepthwiseGeometry& g) {
  const WidePlan plan = wide_conv_plan(g, false);
  if (g.sw == 1) wide_wgrad<1>(ws, x, go, g.N * g.C, plan);
  if (g.sw == 2) wide_wgrad<2>(ws, x, go, g.N * g.C, plan);
}
#endif

// ---- the specialised fp32 paths ------------------------------------------------------------------
// Which of the fp32 paths above runs a pass (kNone: the phase planes), chosen from the plane geometry
// alone (never N or C), so that a chunk of a tensor's planes takes the path the whole tensor would.
enum class FastPath { kNone, kRegister, kWide, kBlocked };

// The input gradient as a stride-1 forward over grad_output spread out by the stride and padded by
// (K - 1) * d - p (the channel-blocked path; nullopt where that padding would be negative).
std::optional<BlockedGeom> dgrad_blocked_geom(const DepthwiseGeometry& g) {
  const int64_t top = (g.KH - 1) * g.dh - g.pt, left = (g.KW - 1) * g.dw - g.pl;
  if (top < 0 || left < 0) return std::nullopt;
  DepthwiseGeometry g1 = g;
  g1.sh = g1.sw = 1;
  BlockedGeom b = blocked_geom(g.OH, g.OW, g.H, g.W, g1, top, left);
  b.uh = g.sh;
  b.uw = g.sw;
  return b;
}

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
  if (pass == Pass::kInputGradient) {
    const std::optional<BlockedGeom> b = dgrad_blocked_geom(g);
    return b && use_blocked(g, *b) ? FastPath::kBlocked : FastPath::kNone;
  }
  // The weight gradient only on small output planes: each tap's sum runs over the plane in one chain
  // per lane (two for 3-wide rows of other kernels), so the plane bounds the fp32 rounding.
  const bool small_enough = pass == Pass::kForward || g.OH * g.OW <= 256;
  return small_enough && use_blocked(g, blocked_geom(g.H, g.W, g.OH, g.OW, g, g.pt, g.pl)) ? FastPath::kBlocked
                                                                                           : FastPath::kNone;
}

// The forward (out y, in x) or the input gradient (out dx, in grad_output, bias nullptr) on a path.
void run_conv(FastPath path, Pass pass, float* out, const float* in, const float* w, const float* bias,
              const DepthwiseGeometry& g) {
  constexpr int64_t L = at::vec::Vectorized<float>::size();
  const bool dgrad = pass == Pass::kInputGradient;
  switch (path) {
#if defined(CPU_CAPABILITY_AVX512)
    case FastPath::kRegister:
      register_conv(out, in, w, bias, g.N * g.C, g.C, register_conv_plan(g, dgrad));
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
    case FastPath::kBlocked: {
      const std::vector<float> wt = blocked_weights(w, g.C, g.taps(), dgrad);
      std::vector<float> bt;
      if (bias) {
        bt.assign(round_up(g.C, L), 0.f);
        std::copy(bias, bias + g.C, bt.begin());
      }
      const BlockedGeom b = dgrad ? *dgrad_blocked_geom(g) : blocked_geom(g.H, g.W, g.OH, g.OW, g, g.pt, g.pl);
      blocked_conv(out, in, wt.data(), bias ? bt.data() : nullptr, g.N, g.C, b);
      return;
    }
    default:
      TORCH_INTERNAL_ASSERT(false, "depthwise_conv2d: no fp32 path here");
  }
}

// Images per row of partial sums (each row C x (taps + 1)) that run_weight_sums writes: the register
// path sums kWgradImages images a row, the others one.
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
      register_wgrad(ws, x, go, g.N, g.C, register_conv_plan(g, false));
      return;
#endif
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    case FastPath::kWide:
      wide_weight_sums(ws, x, go, g);
      return;
#endif
    case FastPath::kBlocked:
      blocked_wgrad(ws, x, go, g.N, g.C, blocked_geom(g.H, g.W, g.OH, g.OW, g, g.pt, g.pl));
      return;
    default:
      TORCH_INTERNAL_ASSERT(false, "depthwise_conv2d: no fp32 weight-gradient path here");
  }
}

// ---- fp16 / bf16 through the fp32 paths --------------------------------------------------------------
// The paths above are fp32 only, and a half-precision tensor left to the phase planes ran 1.5-6x
// slower than the fp32 one (git show 00da02d:benchmarks/results/depthwise_conv2d_cpu_nchw_half.md). Instead the planes
// go through them in chunks (a few images x a run of channels) widened into per-thread fp32 buffers
// of about L2/4, and the result is narrowed back: memory still carries only the fp16/bf16 tensors,
// and the conversions add ~2 instructions per element.
// Where it pays (thread-time A/B per pass, bf16, both ISAs): every strided pass (1.3-3.8x faster) and
// weight gradient, and stride-1 forward and input gradient on the register and channel-blocked paths'
// maps under 48 wide (1.3-2x). Stride-1 forward and input gradient on wider maps, and on the wide-row
// path at any width, stay with the phase planes, which widen each plane as they go: through fp32 the
// same 3x3 56x56 forward ran 20% (AVX-512) to 45% (AVX2) slower, a 7x7 one 10-30% slower.
bool half_through_fp32(FastPath path, const DepthwiseGeometry& g, Pass pass) {
  if (path == FastPath::kNone) return false;
  if (pass == Pass::kWeightGradient || g.sh > 1 || g.sw > 1) return true;
  return path != FastPath::kWide && g.W < 48;
}

struct PlaneChunks {
  int64_t N, C;              // the tensor's
  int64_t images, channels;  // a chunk's (at most)
  int64_t channel_chunks;
  int64_t count() const { return div_up(N, images) * channel_chunks; }
};

// Chunks of `images` images whose planes need floats_per_plane floats of buffer each: channels in
// multiples of 16 (the channel-blocked path's block) where more than 16 fit.
PlaneChunks plane_chunks(const DepthwiseGeometry& g, int64_t images, int64_t floats_per_plane) {
  constexpr int64_t kChunkFloats = 64 << 10;  // 256 KiB
  int64_t channels = std::max<int64_t>(1, kChunkFloats / (images * floats_per_plane));
  if (channels > 16) channels = channels / 16 * 16;
  channels = std::min(channels, g.C);
  return {g.N, g.C, images, channels, div_up(g.C, channels)};
}

// body(n0, images, c0, channels, in, out) on every chunk, with per-thread buffers of in_floats and
// out_floats: in parallel over chunks where there are enough of them, else one chunk at a time with
// the fp32 kernels' own threads (at::parallel_for runs inline inside a parallel region).
template <typename F>
void for_each_chunk(const PlaneChunks& ch, int64_t in_floats, int64_t out_floats, const F& body) {
  const auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> in(in_floats), out(out_floats);
    for (int64_t k = begin; k < end; ++k) {
      const int64_t n0 = k / ch.channel_chunks * ch.images, c0 = k % ch.channel_chunks * ch.channels;
      body(n0, std::min(ch.images, ch.N - n0), c0, std::min(ch.channels, ch.C - c0), in.data(), out.data());
    }
  };
  if (ch.count() >= 2 * at::get_num_threads()) {
    at::parallel_for(0, ch.count(), 1, run);
  } else {
    run(0, ch.count());
  }
}

// The chunk's geometry: its images and channels as a tensor of their own.
DepthwiseGeometry chunk_geometry(const DepthwiseGeometry& g, int64_t images, int64_t channels) {
  DepthwiseGeometry c = g;
  c.N = images;
  c.C = channels;
  return c;
}

// dst (images, channels, plane) fp32 <- the chunk's planes of src (N, C, plane).
template <typename T>
void widen_chunk(float* dst, const T* src, int64_t C, int64_t plane, int64_t n0, int64_t images, int64_t c0,
                 int64_t channels) {
  for (int64_t n = 0; n < images; ++n) {
    convert_row<T, float>(dst + n * channels * plane, src + ((n0 + n) * C + c0) * plane, channels * plane);
  }
}

template <typename T>
void narrow_chunk(T* dst, const float* src, int64_t C, int64_t plane, int64_t n0, int64_t images, int64_t c0,
                  int64_t channels) {
  for (int64_t n = 0; n < images; ++n) {
    store_row<T, float>(dst + ((n0 + n) * C + c0) * plane, src + n * channels * plane, channels * plane);
  }
}

// run_conv on fp16/bf16 tensors: in (N, C, in planes) and out (N, C, out planes), x and y for the
// forward, grad_output and dx for the input gradient.
template <typename T>
void half_conv(FastPath path, Pass pass, T* out, const T* in, const float* w, const float* bias,
               const DepthwiseGeometry& g) {
  const bool dgrad = pass == Pass::kInputGradient;
  const int64_t x_plane = g.H * g.W, y_plane = g.OH * g.OW, taps = g.taps();
  const int64_t in_plane = dgrad ? y_plane : x_plane, out_plane = dgrad ? x_plane : y_plane;
  const PlaneChunks ch = plane_chunks(g, 1, in_plane + out_plane);
  const int64_t planes = ch.images * ch.channels;
  for_each_chunk(ch, planes * in_plane, planes * out_plane,
                 [&](int64_t n0, int64_t images, int64_t c0, int64_t channels, float* in_buf, float* out_buf) {
                   widen_chunk(in_buf, in, g.C, in_plane, n0, images, c0, channels);
                   run_conv(path, pass, out_buf, in_buf, w + c0 * taps, bias ? bias + c0 : nullptr,
                            chunk_geometry(g, images, channels));
                   narrow_chunk(out, out_buf, g.C, out_plane, n0, images, c0, channels);
                 });
}

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

// ws (div_up(N, images_per_weight_row(path)), C, taps + 1). A chunk is one row's images, so it
// writes whole rows of its channels.
template <typename T>
void half_weight_sums(FastPath path, float* ws, const T* x, const T* go, const DepthwiseGeometry& g) {
  const int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW, slots = g.taps() + 1;
  const PlaneChunks ch = plane_chunks(g, images_per_weight_row(path), in_plane + out_plane);
  const int64_t planes = ch.images * ch.channels;
  for_each_chunk(ch, planes * (in_plane + out_plane), ch.channels * slots,
                 [&](int64_t n0, int64_t images, int64_t c0, int64_t channels, float* in, float* out) {
                   float* go_in = in + images * channels * in_plane;
                   widen_chunk(in, x, g.C, in_plane, n0, images, c0, channels);
                   widen_chunk(go_in, go, g.C, out_plane, n0, images, c0, channels);
                   run_weight_sums(path, out, in, go_in, chunk_geometry(g, images, channels));
                   std::copy(out, out + channels * slots, ws + (n0 / ch.images * g.C + c0) * slots);
                 });
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

template <typename T>
DepthwiseLayoutKernels<T> nchw_kernels() {
  return {&forward<T>, &backward_input<T>, &weight_partials<T>};
}

template DepthwiseLayoutKernels<float> nchw_kernels<float>();
template DepthwiseLayoutKernels<double> nchw_kernels<double>();
template DepthwiseLayoutKernels<c10::Half> nchw_kernels<c10::Half>();
template DepthwiseLayoutKernels<c10::BFloat16> nchw_kernels<c10::BFloat16>();

}  // namespace fastops::cpu
