// squeeze_excite on the CPU: the four memory passes of an SE block y = x * gate(fc2(act(fc1(mean_hw(x))))).
// The act and gate between them run in ATen (csrc/squeeze_excite_op.cpp); the FCs too, but for a
// small float32 batch at the AVX-512 level, which runs the FC kernels at the end of this file.
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
inline namespace CPU_CAPABILITY {
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

}  // namespace

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

namespace {

// ---- the block's FCs: float32, a small batch, AVX-512 --------------------------------------------
// out = in W^T + b (forward) and in_grad = g W, W_grad = g^T in (backward), for in of M <= kFcMaxRows
// rows. MKL's sgemm on 8 rows of 576x144 takes 21-25 us with W in L2 and 36-43 us inside the block's
// fwd+bwd, where W comes from L3 (measured on this Zen 4); these walk W once, row by row, in register
// blocks (forward: 4 rows of `in` x 4 W rows, summed across lanes by one transposing tree; backward: 8
// rows x 32 columns of in_grad, the weight_grad row formed in the same pass over W). The AVX2 level
// keeps MKL: there ours measured 0.81-0.93x its forward (git show 00da02d:benchmarks/results/squeeze_excite_cpu_fc.md).
// Every output is summed by one task in a fixed order: bitwise the same for any thread count.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kFcRowBlock = 8;     // rows of the backward's register block
constexpr int64_t kFcForwardRows = 4;  // rows of the forward's, by 4 W rows

// The first `count` lanes of p (the rest zero) / stored to p; count in [0, 16].
inline FVec load_first(const float* p, int64_t count) {
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << count) - 1), p);
}
inline void store_first(float* p, const FVec& v, int64_t count) {
  _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << count) - 1), v);
}

// GCC 12 keeps an array of at::vec::Vectorized accumulators in memory (a store per accumulator per
// iteration); an array of __m512 indexed by constants stays in registers.
using NativeVec = __m512;
inline NativeVec native_fmadd(NativeVec a, NativeVec b, NativeVec c) { return _mm512_fmadd_ps(a, b, c); }

// sums[r] = the sum of row r of lanes (FVec::size() rows of FVec::size() floats).
[[gnu::noinline]] void sum_lanes(float* sums, const float* lanes) {
  std::array<FVec, FVec::size()> rows;
  for (int64_t r = 0; r < FVec::size(); ++r) rows[r] = FVec::loadu(lanes + r * FVec::size());
  sum_each(rows.data()).store(sums);
}

// `in` copied to rows of a whole number of vectors and blocks, zero-padded, so the walks below load
// it without tails; W's last partial vector is a masked load, zero past K, so padding adds 0 * 0.
struct PaddedRows {
  int64_t stride;  // declared first: data's size is computed from it
  std::vector<float> data;
  PaddedRows(const float* src, int64_t rows, int64_t cols, int64_t padded_rows)
      : stride(round_up(std::max<int64_t>(cols, 1), FVec::size())),
        data(static_cast<size_t>(padded_rows * stride), 0.f) {
    for (int64_t r = 0; r < rows; ++r) std::copy(src + r * cols, src + (r + 1) * cols, data.data() + r * stride);
  }
  const float* row(int64_t r) const { return data.data() + r * stride; }
};

// Forward, one register block: dot products of in rows [m0, m0 + 4) with the kCols W rows w_rows
// (4 * kCols = one vector of sums), summed across lanes by one transposing tree into `sums`.
template <int kCols>
inline void fc_forward_block(float* sums, const PaddedRows& in, int64_t m0, const float* const* w_rows, int64_t K) {
  constexpr int64_t V = FVec::size();
  std::array<NativeVec, kFcForwardRows * kCols> acc;
  static_for<kFcForwardRows * kCols>([&](auto q) { acc[q] = FVec(0.f); });
  const int64_t whole = K / V * V;
  if (whole < K) {  // the partial vector first, so the loop below is all whole vectors
    static_for<kFcForwardRows>([&](auto i) {
      const FVec x = FVec::loadu(in.row(m0 + i) + whole);
      static_for<kCols>([&](auto j) { acc[i * kCols + j] = x * load_first(w_rows[j] + whole, K - whole); });
    });
  }
  for (int64_t k = 0; k < whole; k += V) {
    std::array<NativeVec, kCols> w;
    static_for<kCols>([&](auto j) { w[j] = FVec::loadu(w_rows[j] + k); });
    static_for<kFcForwardRows>([&](auto i) {
      const NativeVec x = FVec::loadu(in.row(m0 + i) + k);
      static_for<kCols>([&](auto j) { acc[i * kCols + j] = native_fmadd(x, w[j], acc[i * kCols + j]); });
    });
  }
  alignas(64) float lanes[kFcForwardRows * kCols][FVec::size()];
  static_for<kFcForwardRows * kCols>([&](auto q) { FVec(acc[q]).store(lanes[q]); });
  sum_lanes(sums, &lanes[0][0]);
}

// out (M x N) = in (M x K) W^T (N x K) + bias.
void fc_forward(float* out, const float* in_ptr, const float* weight, const float* bias, int64_t M, int64_t K,
                int64_t N) {
  constexpr int kCols = FVec::size() / kFcForwardRows;
  const int64_t padded_m = round_up(M, kFcForwardRows);
  const PaddedRows in(in_ptr, M, K, padded_m);
  const int64_t col_blocks = div_up(N, kCols);
  // ~64K FMAs a task: a 8x576x144 forward is 1 or 2 tasks, not one per W row pair.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (padded_m * in.stride * kCols));
  at::parallel_for(0, col_blocks, grain, [&](int64_t begin, int64_t end) {
    alignas(64) float sums[FVec::size()];
    for (int64_t cb = begin; cb < end; ++cb) {
      const int64_t n0 = cb * kCols;
      // A block past N repeats the last row; its sums are dropped.
      std::array<const float*, kCols> w_rows;
      for (int j = 0; j < kCols; ++j) w_rows[j] = weight + std::min(n0 + j, N - 1) * K;
      for (int64_t m0 = 0; m0 < M; m0 += kFcForwardRows) {
        fc_forward_block<kCols>(sums, in, m0, w_rows.data(), K);
        for (int64_t i = 0; i < std::min(kFcForwardRows, M - m0); ++i) {
          for (int64_t j = 0; j < std::min<int64_t>(kCols, N - n0); ++j) {
            const float dot = sums[i * kCols + j];
            out[(m0 + i) * N + n0 + j] = bias != nullptr ? dot + bias[n0 + j] : dot;
          }
        }
      }
    }
  });
}

// The backward's vectors of a column slice: whole, or (the last slice) masked to `lanes` each.
template <int kVecs, bool kMasked>
struct SliceIo {
  std::array<int64_t, kVecs> lanes;
  NativeVec load(const float* p, int v) const {
    if constexpr (kMasked) return load_first(p + v * FVec::size(), lanes[v]);
    return FVec::loadu(p + v * FVec::size());
  }
  void store(float* p, NativeVec value, int v) const {
    if constexpr (kMasked) {
      store_first(p + v * FVec::size(), value, lanes[v]);
    } else {
      FVec(value).store(p + v * FVec::size());
    }
  }
};

// One sweep over W's rows for the column slice at k0 (kVecs vectors): in_grad rows [m0, m0 + 8) =
// g W, accumulated in registers; with kWeightGrad also each weight_grad row = g^T in over all rows.
template <int kVecs, bool kMasked, bool kWeightGrad>
void fc_backward_sweep(float* in_grad, float* weight_grad, const PaddedRows& grad, const PaddedRows& in,
                       const float* weight, int64_t M, int64_t K, int64_t N, int64_t k0, int64_t m0,
                       const SliceIo<kVecs, kMasked>& io) {
  std::array<const float*, kFcRowBlock> g_rows;
  for (int64_t i = 0; i < kFcRowBlock; ++i) g_rows[i] = grad.row(m0 + i);
  std::array<NativeVec, kFcRowBlock * kVecs> acc;
  static_for<kFcRowBlock * kVecs>([&](auto q) { acc[q] = FVec(0.f); });
  const int64_t padded_m = round_up(M, kFcRowBlock);
  for (int64_t n = 0; n < N; ++n) {
    std::array<NativeVec, kVecs> w, wg;
    static_for<kVecs>([&](auto v) { w[v] = io.load(weight + n * K + k0, v), wg[v] = FVec(0.f); });
    static_for<kFcRowBlock>([&](auto i) {
      const NativeVec g = FVec(g_rows[i][n]);
      static_for<kVecs>([&](auto v) {
        acc[i * kVecs + v] = native_fmadd(g, w[v], acc[i * kVecs + v]);
        if constexpr (kWeightGrad) wg[v] = native_fmadd(g, FVec::loadu(in.row(m0 + i) + k0 + v * FVec::size()), wg[v]);
      });
    });
    if constexpr (kWeightGrad) {
      for (int64_t m = m0 + kFcRowBlock; m < padded_m; ++m) {
        const NativeVec g = FVec(grad.row(m)[n]);
        static_for<kVecs>(
            [&](auto v) { wg[v] = native_fmadd(g, FVec::loadu(in.row(m) + k0 + v * FVec::size()), wg[v]); });
      }
      static_for<kVecs>([&](auto v) { io.store(weight_grad + n * K + k0, wg[v], v); });
    }
  }
  if (in_grad == nullptr) return;
  static_for<kFcRowBlock>([&](auto i) {
    if (m0 + i >= M) return;
    static_for<kVecs>([&](auto v) { io.store(in_grad + (m0 + i) * K + k0, acc[i * kVecs + v], v); });
  });
}

// Backward over the column slice [k0, k0 + kVecs * V) of K: in_grad (M x K) = g W and weight_grad
// (N x K) = g^T in, walking W's rows once (the first sweep also forms weight_grad; more sweeps for
// each further block of 8 rows of in_grad re-read the slice of W from cache).
template <int kVecs, bool kMasked>
void fc_backward_slice(float* in_grad, float* weight_grad, const PaddedRows& grad, const PaddedRows& in,
                       const float* weight, int64_t M, int64_t K, int64_t N, int64_t k0) {
  SliceIo<kVecs, kMasked> io;
  for (int v = 0; v < kVecs; ++v) io.lanes[v] = std::clamp<int64_t>(K - (k0 + v * FVec::size()), 0, FVec::size());
  fc_backward_sweep<kVecs, kMasked, true>(in_grad, weight_grad, grad, in, weight, M, K, N, k0, 0, io);
  if (in_grad == nullptr) return;
  for (int64_t m0 = kFcRowBlock; m0 < M; m0 += kFcRowBlock) {
    fc_backward_sweep<kVecs, kMasked, false>(in_grad, weight_grad, grad, in, weight, M, K, N, k0, m0, io);
  }
}

void fc_backward(float* in_grad, float* weight_grad, const float* grad_ptr, const float* in_ptr, const float* weight,
                 int64_t M, int64_t K, int64_t N) {
  constexpr int kVecs = 2;  // 16 in_grad accumulators
  constexpr int64_t kSlice = kVecs * FVec::size();
  const int64_t padded_m = round_up(M, kFcRowBlock);
  // grad rows padded too: the register block reads 8 rows' g[n] whatever M is (zeros past M).
  const PaddedRows grad(grad_ptr, M, N, padded_m), in(in_ptr, M, K, padded_m);
  const int64_t slices = div_up(K, kSlice);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (padded_m * N * kSlice));
  at::parallel_for(0, slices, grain, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      if ((s + 1) * kSlice <= K) {
        fc_backward_slice<kVecs, false>(in_grad, weight_grad, grad, in, weight, M, K, N, s * kSlice);
      } else {
        fc_backward_slice<kVecs, true>(in_grad, weight_grad, grad, in, weight, M, K, N, s * kSlice);
      }
    }
  });
}
#endif

}  // namespace

#if defined(CPU_CAPABILITY_AVX512)
bool se_fc_applies(const at::Tensor& input) {
  return input.device().is_cpu() && input.scalar_type() == at::kFloat && input.dim() == 2 &&
         input.size(0) <= kFcMaxRows;
}

namespace {
// The operands as the kernels read them. The block's raw ops check every argument with its name
// (csrc/squeeze_excite_op.cpp), so this is an invariant, kept as a guard against a read out of bounds.
void assert_fc_operand(const at::Tensor& t, at::IntArrayRef shape) {
  TORCH_INTERNAL_ASSERT(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.sizes() == shape,
                        "fastops.squeeze_excite: FC operand ", str(t.device()), " ", str(t.scalar_type()), " ",
                        str(t.sizes()), " where a CPU float32 tensor of shape ", str(shape), " was expected");
}
}  // namespace

at::Tensor se_fc_forward(const at::Tensor& input_in, const at::Tensor& weight_in, const at::Tensor& bias_in) {
  const at::Tensor input = input_in.contiguous(), weight = weight_in.contiguous();
  const at::Tensor bias = bias_in.defined() ? bias_in.contiguous() : bias_in;
  const int64_t M = input.size(0), K = input.size(1), N = weight.size(0);
  assert_fc_operand(weight, {N, K});
  if (bias.defined()) assert_fc_operand(bias, {N});
  at::Tensor out = at::empty({M, N}, input.options());
  if (out.numel() == 0) return out;
  if (K == 0) return bias.defined() ? out.copy_(bias.expand({M, N})) : out.zero_();
  fc_forward(out.data_ptr<float>(), input.const_data_ptr<float>(), weight.const_data_ptr<float>(),
             bias.defined() ? bias.const_data_ptr<float>() : nullptr, M, K, N);
  return out;
}

std::tuple<at::Tensor, at::Tensor> se_fc_backward(const at::Tensor& grad_in, const at::Tensor& input_in,
                                                  const at::Tensor& weight_in, bool input_grad) {
  const at::Tensor grad = grad_in.contiguous(), input = input_in.contiguous(), weight = weight_in.contiguous();
  const int64_t M = input.size(0), K = input.size(1), N = weight.size(0);
  assert_fc_operand(weight, {N, K});
  assert_fc_operand(grad, {M, N});
  at::Tensor in_grad = input_grad ? at::empty({M, K}, input.options()) : at::Tensor();
  at::Tensor weight_grad = at::empty({N, K}, input.options());
  if (M == 0 || N == 0 || K == 0) {
    if (in_grad.defined()) in_grad.zero_();
    return {in_grad, weight_grad.zero_()};
  }
  fc_backward(input_grad ? in_grad.data_ptr<float>() : nullptr, weight_grad.data_ptr<float>(),
              grad.const_data_ptr<float>(), input.const_data_ptr<float>(), weight.const_data_ptr<float>(), M, K, N);
  return {in_grad, weight_grad};
}
#else
// The AVX2 and DEFAULT levels: the block keeps ATen's GEMMs.
bool se_fc_applies(const at::Tensor&) { return false; }
at::Tensor se_fc_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "fastops.squeeze_excite: the small-batch FC kernels need the AVX-512 level");
}
std::tuple<at::Tensor, at::Tensor> se_fc_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool) {
  TORCH_CHECK(false, "fastops.squeeze_excite: the small-batch FC kernels need the AVX-512 level");
}
#endif

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
