// depthwise_conv2d's NCHW fp32 kernels for small maps, channel-blocked (every ISA level; where they
// run: use_blocked below, fast_path in depthwise_conv2d_nchw.cpp).
//
// One image and 16 (AVX-512) / 8 (AVX2) channels per task, transposed into a zero-padded tile with
// the channels innermost, so the taps vectorise over channels as in the NHWC kernels. Its input
// gradient at any stride is a stride-1 forward over grad_output spread out by the stride: (s*s - 1)
// of s*s products multiply an inserted zero, still faster than the phase planes on small maps.
//
// On small maps a plane is a few vectors long, so the plane-at-a-time gather spends its time on
// per-plane setup and partial rows. Here L channels at a time (L = fp32 lanes) are transposed into a
// zero-padded [Hp][Wp][L] tile (L1/L2-resident), the taps run vectorised over the channel lanes with
// P output pixels of a row in registers, and the [OH][OWp][L] result is transposed back into the NCHW
// planes: x and y cross memory once, in the caller's layout.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "depthwise_conv2d_nchw.h"

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace nchw {
namespace {

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

}  // namespace

bool use_blocked(const DepthwiseGeometry& g, Pass pass) {
  if (pass == Pass::kInputGradient) {
    const std::optional<BlockedGeom> b = dgrad_blocked_geom(g);
    return b && use_blocked(g, *b);
  }
  // The weight gradient only on small output planes: each tap's sum runs over the plane in one chain
  // per lane (two for 3-wide rows of other kernels), so the plane bounds the fp32 rounding.
  const bool small_enough = pass == Pass::kForward || g.OH * g.OW <= 256;
  return small_enough && use_blocked(g, blocked_geom(g.H, g.W, g.OH, g.OW, g, g.pt, g.pl));
}

void blocked_conv(float* out, const float* in, const float* w, const float* bias, const DepthwiseGeometry& g,
                  bool dgrad) {
  constexpr int64_t L = at::vec::Vectorized<float>::size();
  const std::vector<float> wt = blocked_weights(w, g.C, g.taps(), dgrad);
  std::vector<float> bt;
  if (bias) {
    bt.assign(round_up(g.C, L), 0.f);
    std::copy(bias, bias + g.C, bt.begin());
  }
  const BlockedGeom b = dgrad ? *dgrad_blocked_geom(g) : blocked_geom(g.H, g.W, g.OH, g.OW, g, g.pt, g.pl);
  blocked_conv(out, in, wt.data(), bias ? bt.data() : nullptr, g.N, g.C, b);
}

void blocked_wgrad(float* ws, const float* x, const float* go, const DepthwiseGeometry& g) {
  blocked_wgrad(ws, x, go, g.N, g.C, blocked_geom(g.H, g.W, g.OH, g.OW, g, g.pt, g.pl));
}

}  // namespace nchw
}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
