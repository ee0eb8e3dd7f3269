// depthwise_conv2d's NCHW fp32 kernels for small planes held in registers (the AVX-512 level only; where
// they run: use_register_plane below, fast_path in depthwise_conv2d_nchw.cpp).
//
// fp32 3x3 kernels on rows to 16 wide, and wider kernels' weight gradient on rows over 8 wide
// (register_conv, register_wgrad: whole rows per vector, a tap is one two-source permute; stride 1
// and, on rows over 8 wide, stride 2 for the forward and weight gradient).
//
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
#include <ATen/Parallel.h>
#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "depthwise_conv2d_nchw.h"

#if defined(CPU_CAPABILITY_AVX512)
namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace nchw {
namespace {

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

}  // namespace

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

void register_conv(float* out, const float* in, const float* w, const float* bias, const DepthwiseGeometry& g,
                   bool dgrad) {
  register_conv(out, in, w, bias, g.N * g.C, g.C, register_conv_plan(g, dgrad));
}

void register_wgrad(float* ws, const float* x, const float* go, const DepthwiseGeometry& g) {
  register_wgrad(ws, x, go, g.N, g.C, register_conv_plan(g, false));
}

}  // namespace nchw
}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
#endif
