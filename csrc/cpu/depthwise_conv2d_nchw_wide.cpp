// depthwise_conv2d's NCHW fp32 kernels for 3x3 rows over 16 wide (the AVX-512 and AVX2 levels; where they
// run: use_wide_rows below, fast_path in depthwise_conv2d_nchw.cpp).
//
// The planes are read as they lie (wide_conv, wide_wgrad): a tap is one unaligned load, masked at the
// row's edges, two and a permute at column stride 2; the stride-2 input gradient spreads a window of
// grad_output to the lanes of each column parity (wide_dgrad_s2).
//
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

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace nchw {
namespace {

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

WidePlan wide_conv_plan(const DepthwiseGeometry& g, bool dgrad) {
  const auto offsets = tap_offsets(g, dgrad);
  return dgrad ? wide_plan(g.OH, g.OW, g.H, g.W, 1, 1, offsets) : wide_plan(g.H, g.W, g.OH, g.OW, g.sh, g.sw, offsets);
}

}  // namespace

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

}  // namespace nchw
}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
#endif
