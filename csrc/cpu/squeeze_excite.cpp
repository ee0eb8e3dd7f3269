// squeeze_excite on the CPU: the four memory passes of an SE block y = x * gate(fc2(act(fc1(mean_hw(x))))).
// The tiny FCs, act and gate between them run in ATen (fastops/ops/squeeze_excite.py).
//   squeeze_excite_pool:             p[n,c]      = sum_hw x[n,c,hw] / HW
//   squeeze_excite_scale:            y[n,c,hw]   = x[n,c,hw] * s[n,c]
//   squeeze_excite_backward_reduce:  ds[n,c]     = sum_hw g[n,c,hw] * x[n,c,hw]
//   squeeze_excite_backward_input:   dx[n,c,hw]  = g[n,c,hw] * s[n,c] + dp[n,c] / HW
// so the backward reads g and x once for the reduction and writes dx in one pass, where eager writes
// g * x, reduces it, writes g * s, expands the pool gradient and adds.
// Layouts (fastops/squeeze_excite.h): NCHW rows of HW per (n, c), or channels_last rows of C per
// (n, hw); any other input is made contiguous first.
// Strategy: at::vec in opmath (fp16/bf16 widened to fp32 vectors), at::parallel_for.
//   NCHW reductions: one task per block of (n, c) rows, four vector accumulators per row (a short
//     row's tail vectors spread over them too). The product sums of 7x7 maps walk groups of W rows
//     as whole aligned vectors instead (channel_sums).
//   NHWC reductions: one task per (n, 4-vector channel chunk); the chunk's accumulators stay in
//     registers while the task walks the HW rows; a chunk of 1 or 2 vectors (C = 16, 32) walks them in
//     4 or 2 row phases, so four adds are in flight either way. Every (n, c) is summed by one task in
//     a fixed order, so the result is bitwise the same for any thread count.
//   Broadcast passes: flat over rows, the per-channel factors (and shifts) loaded as vectors (NHWC;
//     held in registers for a whole image when C is one or two vectors) or splatted once per row
//     (NCHW; on 7x7 maps permuted per vector from a group of W rows' factors).
// Bytes per element of x: pool and backward_reduce read 1 (resp. 2) x sizeof(T); scale reads and
// writes sizeof(T) each; backward_input reads g and writes dx. The (N, C) tensors are noise.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <fastops/checks.h>
#include <fastops/cpu_loops.h>
#include <fastops/cpu_reduce.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/squeeze_excite.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <type_traits>
#include <vector>

namespace fastops::cpu {
namespace {

constexpr int kUnroll = 4;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
constexpr bool kHasLanePermute = true;
// v's lanes picked by idx (one int32 lane number per lane): one vpermps.
inline FVec permute_lanes(const FVec& v, const int32_t* idx) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_permutexvar_ps(_mm512_loadu_si512(idx), v);
#else
  return _mm256_permutevar8x32_ps(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx)));
#endif
}
#else
constexpr bool kHasLanePermute = false;
inline FVec permute_lanes(const FVec& v, const int32_t*) { return v; }
#endif

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// out lane r = the sum of v[r]'s lanes, for W row vectors: a transposing tree of horizontal adds
// (~1.5 instructions a row, where one horizontal sum per row costs ~9).
inline FVec sum_each(const FVec* v) {
  auto eight = [](const __m256* u) {
    const __m256 t0 = _mm256_hadd_ps(u[0], u[1]), t1 = _mm256_hadd_ps(u[2], u[3]);
    const __m256 t2 = _mm256_hadd_ps(u[4], u[5]), t3 = _mm256_hadd_ps(u[6], u[7]);
    const __m256 q0 = _mm256_hadd_ps(t0, t1), q1 = _mm256_hadd_ps(t2, t3);
    // q0 = [v0..v3 sums of lanes 0-3 | of lanes 4-7], q1 the same for v4..v7.
    return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
  };
#if defined(CPU_CAPABILITY_AVX512)
  std::array<__m256, 16> half;
  for (int r = 0; r < 16; ++r) {
    const __m512 z = v[r];
    half[r] = _mm256_add_ps(_mm512_castps512_ps256(z), _mm512_extractf32x8_ps(z, 1));
  }
  return _mm512_insertf32x8(_mm512_castps256_ps512(eight(half.data())), eight(half.data() + 8), 1);
#else
  std::array<__m256, 8> rows;
  for (int r = 0; r < 8; ++r) rows[r] = v[r];
  return eight(rows.data());
#endif
}
#else
inline FVec sum_each(const FVec* v) {
  std::array<float, FVec::size()> sums;
  for (int64_t r = 0; r < FVec::size(); ++r) sums[r] = horizontal_sum<float>(v[r]);
  return FVec::loadu(sums.data());
}
#endif

// NCHW rows of HW with W <= HW < kShortRow * W, not a whole number of vectors (7x7 maps), take the
// group walks of channel_sums (the product sums) and channel_affine. Measured there (fp32, 1 thread,
// thread time, per-row walk -> group walk): 8x576x7x7 scale 1.15-1.62x faster, backward_input
// 1.13-1.47x, backward_reduce 1.10x (AVX2) / 1.51x (AVX-512); the pool's single stream did not gain
// (0.8x on AVX2, 0.95x on AVX-512), nor did 14x14 maps (0.91-1.06x).
constexpr int64_t kShortRow = 8;
template <typename M, int64_t W>
constexpr bool short_rows(int64_t HW) {
  return kHasLanePermute && std::is_same_v<M, float> && HW >= W && HW < kShortRow * W && HW % W != 0;
}

// Bit masks of lanes: kLanesBelow + 16 - b keeps lanes [0, b); kLanesFrom + 16 - a keeps [a, 16).
alignas(64) constexpr int32_t kLanesBelow[32] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
alignas(64) constexpr int32_t kLanesFrom[32] = {0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,
                                                -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
inline FVec lane_mask(const int32_t* table, int64_t lane) {
  return FVec::loadu(reinterpret_cast<const float*>(table + 16 - lane));
}

// a[off] (or a[off] * b[off]) as one opmath vector; b is not touched without kProduct.
template <typename T, bool kProduct>
inline OpmathVec<T> load_term(const T* a, const T* b, int64_t off) {
  if constexpr (kProduct) {
    return load_opmath<T>(a + off) * load_opmath<T>(b + off);
  } else {
    return load_opmath<T>(a + off);
  }
}

// A partial vector; the masked loads give zeros past count, so the term is 0 there.
template <typename T, bool kProduct>
inline OpmathVec<T> load_term(const T* a, const T* b, int64_t off, int64_t count) {
  if constexpr (kProduct) {
    return load_opmath<T>(a + off, count) * load_opmath<T>(b + off, count);
  } else {
    return load_opmath<T>(a + off, count);
  }
}

// sum over [0, len) of a[i] (or a[i] * b[i]), in opmath with kUnroll independent accumulators.
template <typename T, bool kProduct>
inline opmath_t<T> row_sum(const T* a, const T* b, int64_t len) {
  using MVec = OpmathVec<T>;
  constexpr int64_t W = MVec::size();
  std::array<MVec, kUnroll> acc;
  acc.fill(MVec(0));
  int64_t i = 0;
  for (; i + kUnroll * W <= len; i += kUnroll * W) {
    static_for<kUnroll>([&](auto k) { acc[k] = acc[k] + load_term<T, kProduct>(a, b, i + k * W); });
  }
  // The rest (under kUnroll vectors, the last maybe partial), one vector per accumulator: a short row
  // (7x7, 14x14 maps) is then kUnroll independent adds, not one chain.
  static_for<kUnroll>([&](auto k) {
    const int64_t off = i + k * W;
    if (off + W <= len) {
      acc[k] = acc[k] + load_term<T, kProduct>(a, b, off);
    } else if (off < len) {
      acc[k] = acc[k] + load_term<T, kProduct>(a, b, off, len - off);
    }
  });
  return horizontal_sum<opmath_t<T>>((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

// One NHWC task's sums over HW rows of C for NV vectors of channels (the last holding `last` lanes,
// masked when kMasked), into out[0, NV). A chunk narrower than kUnroll vectors (C = 16 or 32) keeps R
// row phases of accumulators, so kUnroll adds are in flight either way; the phases are added in order.
template <typename T, bool kProduct, int NV, bool kMasked>
inline void nhwc_chunk_sums(std::array<OpmathVec<T>, kUnroll>& out, const T* a, const T* b, int64_t HW, int64_t C,
                            int64_t last) {
  using MVec = OpmathVec<T>;
  constexpr int64_t W = MVec::size();
  constexpr int R = kUnroll / NV > 0 ? kUnroll / NV : 1;
  std::array<std::array<MVec, NV>, R> acc;
  for (auto& phase : acc) phase.fill(MVec(0));
  auto add_row = [&](std::array<MVec, NV>& phase, int64_t o) {
    static_for<NV>([&](auto k) {
      if constexpr (kMasked && k + 1 == NV) {
        phase[k] = phase[k] + load_term<T, kProduct>(a, b, o + k * W, last);
      } else {
        phase[k] = phase[k] + load_term<T, kProduct>(a, b, o + k * W);
      }
    });
  };
  int64_t hw = 0;
  for (; hw + R <= HW; hw += R) static_for<R>([&](auto p) { add_row(acc[p], (hw + p) * C); });
  for (; hw < HW; ++hw) add_row(acc[0], hw * C);
  static_for<NV>([&](auto k) {
    MVec sum = acc[0][k];
    static_for<R - 1>([&](auto p) { sum = sum + acc[p + 1][k]; });
    out[k] = sum;
  });
}

template <typename T, bool kProduct, int NV>
inline void nhwc_chunk_sums(std::array<OpmathVec<T>, kUnroll>& out, const T* a, const T* b, int64_t HW, int64_t C,
                            int64_t last) {
  if (last == OpmathVec<T>::size()) {
    nhwc_chunk_sums<T, kProduct, NV, false>(out, a, b, HW, C, last);
  } else {
    nhwc_chunk_sums<T, kProduct, NV, true>(out, a, b, HW, C, last);
  }
}

// out[n, c] = sum_hw a (or a * b), divided by HW when kMean; a and b in the layout of `shape`.
template <typename T, bool kProduct, bool kMean>
void channel_sums(opmath_t<T>* out, const T* a, const T* b, const SqueezeExciteShape& shape) {
  using M = opmath_t<T>;
  using MVec = OpmathVec<T>;
  constexpr int64_t W = MVec::size();
  const int64_t N = shape.N, C = shape.C, HW = shape.HW;
  const M divisor = static_cast<M>(HW);
  if (!shape.channels_last) {
    auto row_by_row = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const M sum = row_sum<T, kProduct>(a + r * HW, kProduct ? b + r * HW : b, HW);
        out[r] = kMean ? sum / divisor : sum;
      }
    };
    if constexpr (kProduct && kHasLanePermute && std::is_same_v<M, float>) {
      if (short_rows<M, W>(HW)) {
        // Short rows that end mid-vector (7x7 maps): groups of W rows are HW whole vectors, loaded
        // aligned to the group (no load splits a cache line when the group starts on one), each
        // row's first and last vector masked to its lanes. The W rows' partial vectors are summed
        // by one transposing tree instead of W horizontal sums. Groups are fixed multiples of W
        // rows, so a row's sum does not depend on the thread count.
        const int64_t groups = N * C / W;
        const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (W * HW));
        at::parallel_for(0, groups, grain, [&](int64_t begin, int64_t end) {
          std::array<MVec, W> partial;
          for (int64_t group = begin; group < end; ++group) {
            const T* pa = a + group * W * HW;
            const T* pb = b + group * W * HW;
            for (int64_t q = 0; q < W; ++q) {
              const int64_t first = q * HW, stop = first + HW;
              const int64_t k0 = first / W, k1 = (stop - 1) / W;  // k1 > k0, as HW > W
              std::array<MVec, kUnroll> acc;
              acc[0] = load_term<T, kProduct>(pa, pb, k0 * W) & lane_mask(kLanesFrom, first - k0 * W);
              acc[1] = load_term<T, kProduct>(pa, pb, k1 * W) & lane_mask(kLanesBelow, stop - k1 * W);
              acc[2] = acc[3] = MVec(M(0));
              int64_t k = k0 + 1;
              for (; k + 1 < k1; k += 2) {
                acc[2] = acc[2] + load_term<T, kProduct>(pa, pb, k * W);
                acc[3] = acc[3] + load_term<T, kProduct>(pa, pb, (k + 1) * W);
              }
              if (k < k1) acc[2] = acc[2] + load_term<T, kProduct>(pa, pb, k * W);
              partial[q] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
            }
            const MVec sums = sum_each(partial.data());
            (kMean ? sums / MVec(divisor) : sums).store(out + group * W);
          }
        });
        row_by_row(groups * W, N * C);
        return;
      }
    }
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(HW, 1));
    at::parallel_for(0, N * C, grain, row_by_row);
    return;
  }
  constexpr int64_t kChunk = kUnroll * W;
  const int64_t chunks = div_up(C, kChunk);
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(HW * kChunk, 1));
  at::parallel_for(0, N * chunks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / chunks, c0 = (task % chunks) * kChunk;
      const int64_t width = std::min(kChunk, C - c0);
      const T* pa = a + n * HW * C + c0;
      const T* pb = kProduct ? b + n * HW * C + c0 : b;
      std::array<MVec, kUnroll> acc;
      const int64_t vectors = div_up(width, W), last = width - (vectors - 1) * W;
      static_assert(kUnroll == 4, "the switch below covers 1 to kUnroll vectors");
      switch (vectors) {
        case 1:
          nhwc_chunk_sums<T, kProduct, 1>(acc, pa, pb, HW, C, last);
          break;
        case 2:
          nhwc_chunk_sums<T, kProduct, 2>(acc, pa, pb, HW, C, last);
          break;
        case 3:
          nhwc_chunk_sums<T, kProduct, 3>(acc, pa, pb, HW, C, last);
          break;
        default:
          nhwc_chunk_sums<T, kProduct, 4>(acc, pa, pb, HW, C, last);
          break;
      }
      for (int k = 0; k * W < width; ++k) {
        const MVec v = kMean ? acc[k] / MVec(divisor) : acc[k];
        v.store(out + n * C + c0 + k * W, std::min(W, width - k * W));
      }
    }
  });
}

// out = a * s[n, c] (+ d[n, c] with kShift), in opmath, rounded once.
template <typename T, bool kShift>
void channel_affine(T* out, const T* a, const opmath_t<T>* s, const opmath_t<T>* d, const SqueezeExciteShape& shape) {
  using M = opmath_t<T>;
  using MVec = OpmathVec<T>;
  constexpr int64_t W = MVec::size();
  const int64_t N = shape.N, C = shape.C, HW = shape.HW;
  // Without a shift no "+ 0": x * s + 0 would turn -0 into +0, and scale keeps eager's sign of zero.
  auto apply = [](const MVec& v, const MVec& sv, const MVec& dv) {
    if constexpr (kShift) {
      return at::vec::fmadd(v, sv, dv);
    } else {
      return v * sv;
    }
  };
  if (!shape.channels_last) {
    // One (n, c) row at a time: the factors splatted, whole vectors, then a masked tail.
    auto row_by_row = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const MVec sv(s[r]), dv(kShift ? d[r] : M(0));
        const T* pa = a + r * HW;
        T* po = out + r * HW;
        int64_t i = 0;
        for (; i + W <= HW; i += W) store_opmath<T>(po + i, apply(load_opmath<T>(pa + i), sv, dv), W);
        if (i < HW) store_opmath<T>(po + i, apply(load_opmath<T>(pa + i, HW - i), sv, dv), HW - i);
      }
    };
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(HW, 1));
    if constexpr (kHasLanePermute && std::is_same_v<M, float>) {
      if (short_rows<M, W>(HW)) {
        // Short rows that end mid-vector (7x7 maps): the splat, loop and masked tail of each row
        // cost more than the row's few vectors. W rows are W * HW elements, exactly HW whole
        // vectors; lane j of vector k belongs to row (k * W + j) / HW of the group, so one permute
        // of the group's W factors gives each vector its own (a table of HW index vectors).
        std::vector<int32_t> lane_row(static_cast<size_t>(W * HW));
        for (int64_t i = 0; i < W * HW; ++i) lane_row[i] = static_cast<int32_t>(i / HW);
        at::parallel_for(0, N * C, grain, [&](int64_t begin, int64_t end) {
          int64_t r = begin;
          for (; r + W <= end; r += W) {
            const MVec sv = MVec::loadu(s + r), dv = kShift ? MVec::loadu(d + r) : MVec(M(0));
            const T* pa = a + r * HW;
            T* po = out + r * HW;
            const int32_t* idx = lane_row.data();
            for (int64_t k = 0; k < HW; ++k, idx += W) {
              const MVec svk = permute_lanes(sv, idx), dvk = kShift ? permute_lanes(dv, idx) : dv;
              store_opmath<T>(po + k * W, apply(load_opmath<T>(pa + k * W), svk, dvk), W);
            }
          }
          row_by_row(r, end);
        });
        return;
      }
    }
    at::parallel_for(0, N * C, grain, row_by_row);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(C, 1));
  // A narrow C of whole vectors (16 or 32 channels) keeps the image's factors in registers for all its
  // rows; the loop bounds are locals, so the compiler does not reload them after every store.
  auto rows_of = [&]<int NV>(std::integral_constant<int, NV>) {
    at::parallel_for(0, N * HW, grain, [=](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end;) {
        const int64_t n = r / HW, stop = std::min(end, (n + 1) * HW);
        std::array<MVec, NV> sv, dv;
        static_for<NV>([&](auto k) {
          sv[k] = MVec::loadu(s + n * C + k * W);
          dv[k] = kShift ? MVec::loadu(d + n * C + k * W) : MVec(M(0));
        });
        for (; r < stop; ++r) {
          static_for<NV>([&](auto k) {
            const int64_t o = r * C + k * W;
            store_opmath<T>(out + o, apply(load_opmath<T>(a + o), sv[k], dv[k]), W);
          });
        }
      }
    });
  };
  if (C == W) return rows_of(std::integral_constant<int, 1>{});
  if (C == 2 * W) return rows_of(std::integral_constant<int, 2>{});
  at::parallel_for(0, N * HW, grain, [=](int64_t begin, int64_t end) {
    // The image of row r, stepped along rather than divided out per row.
    int64_t n = begin / HW, hw = begin % HW;
    for (int64_t r = begin; r < end; ++r) {
      const M* ps = s + n * C;
      const M* pd = kShift ? d + n * C : d;
      const T* pa = a + r * C;
      T* po = out + r * C;
      int64_t j = 0;
      for (; j + W <= C; j += W) {
        const MVec dv = kShift ? MVec::loadu(pd + j) : MVec(M(0));
        store_opmath<T>(po + j, apply(load_opmath<T>(pa + j), MVec::loadu(ps + j), dv), W);
      }
      if (j < C) {
        const int64_t count = C - j;
        const MVec dv = kShift ? MVec::loadu(pd + j, count) : MVec(M(0));
        store_opmath<T>(po + j, apply(load_opmath<T>(pa + j, count), MVec::loadu(ps + j, count), dv), count);
      }
      if (++hw == HW) hw = 0, ++n;
    }
  });
}

at::Tensor squeeze_excite_pool(const at::Tensor& x_in) {
  check_se_activation("squeeze_excite_pool", "x", x_in);
  const bool cl = use_channels_last(x_in);
  const at::Tensor x = se_layout(x_in, cl);
  const SqueezeExciteShape shape = se_shape(x, cl);
  at::Tensor out = at::empty({shape.N, shape.C}, x.options().dtype(se_opmath_dtype(x)));
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_squeeze_excite_pool_cpu", [&] {
    channel_sums<scalar_t, false, true>(out.data_ptr<opmath_t<scalar_t>>(), x.const_data_ptr<scalar_t>(), nullptr,
                                        shape);
  });
  return out;
}

at::Tensor squeeze_excite_scale(const at::Tensor& x_in, const at::Tensor& scale_in) {
  const char* op = "squeeze_excite_scale";
  check_se_activation(op, "x", x_in);
  check_se_per_channel(op, "scale", scale_in, "x", x_in);
  const bool cl = use_channels_last(x_in);
  const at::Tensor x = se_layout(x_in, cl);
  const at::Tensor scale = scale_in.contiguous();
  at::Tensor y = at::empty_like(x);
  if (y.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_squeeze_excite_scale_cpu", [&] {
    channel_affine<scalar_t, false>(y.data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                                    scale.const_data_ptr<opmath_t<scalar_t>>(), nullptr, se_shape(x, cl));
  });
  return y;
}

at::Tensor squeeze_excite_backward_reduce(const at::Tensor& grad_in, const at::Tensor& x_in) {
  const char* op = "squeeze_excite_backward_reduce";
  check_se_activation(op, "x", x_in);
  check_same_device(op, "grad_out", grad_in, "x", x_in);
  check_same_dtype(op, "grad_out", grad_in, "x", x_in);
  check_same_shape(op, "grad_out", grad_in, "x", x_in);
  const bool cl = use_channels_last(x_in);
  const at::Tensor x = se_layout(x_in, cl);
  const at::Tensor grad = se_layout(grad_in, cl);
  const SqueezeExciteShape shape = se_shape(x, cl);
  at::Tensor out = at::empty({shape.N, shape.C}, x.options().dtype(se_opmath_dtype(x)));
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_squeeze_excite_backward_reduce_cpu", [&] {
        channel_sums<scalar_t, true, false>(out.data_ptr<opmath_t<scalar_t>>(), grad.const_data_ptr<scalar_t>(),
                                            x.const_data_ptr<scalar_t>(), shape);
      });
  return out;
}

at::Tensor squeeze_excite_backward_input(const at::Tensor& grad_in, const at::Tensor& scale_in,
                                         const at::Tensor& grad_pool_in) {
  const char* op = "squeeze_excite_backward_input";
  check_se_activation(op, "grad_out", grad_in);
  check_se_per_channel(op, "scale", scale_in, "grad_out", grad_in);
  check_se_per_channel(op, "grad_pool", grad_pool_in, "grad_out", grad_in);
  const bool cl = use_channels_last(grad_in);
  const at::Tensor grad = se_layout(grad_in, cl);
  const SqueezeExciteShape shape = se_shape(grad, cl);
  at::Tensor dx = at::empty_like(grad);
  if (dx.numel() == 0) return dx;
  const at::Tensor scale = scale_in.contiguous();
  const at::Tensor grad_pool = grad_pool_in.contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, grad.scalar_type(), "fastops_squeeze_excite_backward_input_cpu", [&] {
        using M = opmath_t<scalar_t>;
        // The mean's gradient, dp / HW, once per (n, c) (a true division, as eager's mean backward),
        // here rather than as an ATen op: on a 14x14 map the op's dispatch costs as much as the pass.
        const int64_t rows = shape.N * shape.C;
        std::vector<M> shift(static_cast<size_t>(rows));
        const M* dp = grad_pool.const_data_ptr<M>();
        using MVec = at::vec::Vectorized<M>;
        const MVec hw(static_cast<M>(shape.HW));
        int64_t i = 0;
        for (; i + MVec::size() <= rows; i += MVec::size()) (MVec::loadu(dp + i) / hw).store(shift.data() + i);
        for (; i < rows; ++i) shift[i] = dp[i] / static_cast<M>(shape.HW);
        channel_affine<scalar_t, true>(dx.data_ptr<scalar_t>(), grad.const_data_ptr<scalar_t>(),
                                       scale.const_data_ptr<M>(), shift.data(), shape);
      });
  return dx;
}

}  // namespace
}  // namespace fastops::cpu

TORCH_LIBRARY_IMPL(fastops, CPU, m) {
  m.impl("squeeze_excite_pool", &fastops::cpu::squeeze_excite_pool);
  m.impl("squeeze_excite_scale", &fastops::cpu::squeeze_excite_scale);
  m.impl("squeeze_excite_backward_reduce", &fastops::cpu::squeeze_excite_backward_reduce);
  m.impl("squeeze_excite_backward_input", &fastops::cpu::squeeze_excite_backward_input);
}
