// batch_norm on the CPU: y = (x - mean) * invstd * weight + bias over the channels of x (dim 1).
//   training: mean and the biased variance of each channel over its N * L elements; invstd =
//             1 / sqrt(var + eps); the unbiased variance is returned for the running statistics.
//   eval:     mean = running_mean, invstd = 1 / sqrt(running_var + eps).
//   backward: sum_dy = sum g, sum_dy_xmu = sum g * (x - mean) per channel;
//             grad_weight = sum_dy_xmu * invstd, grad_bias = sum_dy;
//             training: dx = (g - sum_dy / count - (x - mean) * invstd^2 * sum_dy_xmu / count) * invstd * w
//             eval:     dx = g * invstd * w.
// Layouts (fastops/batch_norm.h): planes (N, C, L) or rows of C (channels_last, or L == 1).
// Strategy: at::vec in opmath (fp16/bf16 widened to fp32 vectors, narrowed two vectors at a time).
//   planes: one task per channel (at::parallel_for over channels): two passes over its N planes into
//     vector accumulators (the values minus the channel's first value, then the squared deviations
//     from the mean), added into float64 every kFlush vectors; then the same task normalises (or,
//     backward, writes dx of) that channel while its planes are still in L2. ATen's NCHW kernel sums
//     with scalar loops and walks the tensor three times.
//   rows: blocks of rows of a fixed size (a function of C only, so every result is the same for any
//     thread count), walked in strips of up to 8 vectors of channels with the accumulators in
//     registers, give per-block partials merged in block order in float64 (Chan's update for the
//     variance); then one elementwise pass.
//   The shift by a first value (of the channel, or of the block) keeps the variance of data far from
//   zero (1e4 +- 1e-2 in fp32) exact: sum(x) / n would round the mean to fp32's spacing there.
// Bytes per element from memory: forward training reads x once for the statistics (their second pass
// reads it from L2) and once more for y (planes: from L2 too) and writes y; eval reads x and writes y;
// backward reads g and x for the sums and again for dx (planes: from L2), and writes dx.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <fastops/batch_norm.h>
#include <fastops/checks.h>
#include <fastops/cpu_loops.h>
#include <fastops/cpu_reduce.h>
#include <fastops/cpu_vec_math.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

// Rows of a reduction block: about 16384 elements (64 KiB of fp32, read again from L2 by the second
// pass), at least 16 rows so that merging the blocks' partials stays a small part of the work.
constexpr int64_t kBlockElements = 16384;
constexpr int64_t kMinBlockRows = 16;

inline int64_t block_rows(int64_t C) { return std::max(kMinBlockRows, kBlockElements / std::max<int64_t>(C, 1)); }

// Sums over one channel of a planes tensor (N planes of L elements, `stride` apart) of NA terms per
// element: term(p, i, k) gives the NA terms of the k elements at p + i (k < W only for a plane's last
// vector; its lanes past k must be 0). Two banks of vector accumulators take alternate vectors, so
// a 4x4 plane's one vector does not wait on the previous plane's add; every kFlush vectors they are
// added into float64 totals, which bounds each float32 partial to a short sum and costs one
// horizontal sum per kFlush vectors instead of one per plane.
constexpr int kFlush = 64;
template <typename T, int NA, typename Term>
std::array<double, NA> channel_sums(const T* base, int64_t N, int64_t stride, int64_t L, const Term& term) {
  using M = opmath_t<T>;
  using MVec = OpmathVec<T>;
  constexpr int64_t W = MVec::size();
  std::array<double, NA> total{};
  std::array<MVec, NA> acc0, acc1;
  acc0.fill(MVec(0));
  acc1.fill(MVec(0));
  int pending = 0;
  auto add = [](std::array<MVec, NA>& acc, const std::array<MVec, NA>& t) {
    for (int a = 0; a < NA; ++a) acc[a] = acc[a] + t[a];
  };
  auto flush = [&] {
    for (int a = 0; a < NA; ++a) {
      total[a] += static_cast<double>(horizontal_sum<M>(acc0[a] + acc1[a]));
      acc0[a] = acc1[a] = MVec(0);
    }
    pending = 0;
  };
  for (int64_t n = 0; n < N; ++n) {
    const T* p = base + n * stride;
    int64_t i = 0;
    for (; i + 2 * W <= L; i += 2 * W) {
      add(acc0, term(p, i, W));
      add(acc1, term(p, i + W, W));
      if ((pending += 2) >= kFlush) flush();
    }
    if (i + W <= L) {
      add(acc0, term(p, i, W));
      i += W;
      ++pending;
    }
    if (i < L) {
      add(acc1, term(p, i, L - i));
      ++pending;
    }
    if (pending >= kFlush) flush();
  }
  flush();
  return total;
}

// k elements from p as opmath lanes (a plain load for a whole vector, else a masked one: lanes past k
// read 0).
template <typename T>
inline OpmathVec<T> load_lanes(const T* p, int64_t k) {
  return k == OpmathVec<T>::size() ? load_opmath<T>(p) : load_opmath<T>(p, k);
}

// v with the lanes from k on set to 0 (k == W: v).
template <typename MVec>
inline MVec first_lanes(const MVec& v, int64_t k) {
  return k == MVec::size() ? v : MVec::set(MVec(0), v, k);
}

// Chan's merge of a part of `n` elements with mean m and squared deviations q into (count, mean, m2).
struct Moments {
  double count = 0, mean = 0, m2 = 0;
  void merge(double n, double m, double q) {
    const double total = count + n;
    const double delta = m - mean;
    mean += delta * (n / total);
    m2 += q + delta * delta * (count * n / total);
    count = total;
  }
};

// The per-channel tensor t (weight, bias, a running statistic) as opmath values; `fill` when undefined.
template <typename M>
std::vector<M> per_channel(const std::optional<at::Tensor>& t, int64_t C, M fill) {
  std::vector<M> out(static_cast<size_t>(C), fill);
  if (!t.has_value() || !t->defined()) return out;
  const at::Tensor v = t->to(c10::CppTypeToScalarType<M>::value).contiguous();
  std::copy_n(v.const_data_ptr<M>(), C, out.begin());
  return out;
}

// out[i] = f(i, k) for the vectors of [0, len): f gives the opmath vector of the k lanes at i. fp16/bf16
// are narrowed two vectors at a time into one full vector (with_narrowing): a single vector of fp32
// lanes fills half a Vectorized<T>, whose partial store at::vec makes through a copy on the stack
// (AVX2 bf16: 40 ns a vector, a 10x slower backward).
template <typename T, typename F>
inline void write_lanes(T* out, int64_t len, const F& f) {
  constexpr int64_t W = OpmathVec<T>::size();
  int64_t i = 0;
  if constexpr (is_reduced_float_v<T>) {
    with_narrowing<T>([&](const auto narrow) {
      for (; i + 2 * W <= len; i += 2 * W) narrow(f(i, W), f(i + W, W)).store(out + i);
    });
  }
  for (; i + W <= len; i += W) store_opmath<T>(out + i, f(i, W), W);
  if (i < len) store_opmath<T>(out + i, f(i, len - i), len - i);
}

// y = x * scale + shift over one plane (or one row, with per-lane factors).
template <typename T>
inline void plane_affine(T* y, const T* x, int64_t len, opmath_t<T> scale, opmath_t<T> shift) {
  using MVec = OpmathVec<T>;
  const MVec s(scale), b(shift);
  write_lanes<T>(y, len, [&](int64_t i, int64_t k) { return at::vec::fmadd(load_lanes<T>(x + i, k), s, b); });
}

template <typename T>
inline void row_affine(T* y, const T* x, int64_t C, const opmath_t<T>* scale, const opmath_t<T>* shift) {
  using MVec = OpmathVec<T>;
  write_lanes<T>(y, C, [&](int64_t j, int64_t k) {
    return at::vec::fmadd(load_lanes<T>(x + j, k), MVec::loadu(scale + j, k), MVec::loadu(shift + j, k));
  });
}

// Training statistics of a planes tensor, and the normalisation of each channel right after its own.
template <typename T>
void planes_forward_training(T* y, const T* x, const BatchNormShape& s, const std::vector<opmath_t<T>>& w,
                             const std::vector<opmath_t<T>>& b, double eps, opmath_t<T>* mean, opmath_t<T>* invstd,
                             opmath_t<T>* unbiased) {
  using M = opmath_t<T>;
  using MVec = OpmathVec<T>;
  const int64_t N = s.N, C = s.C, L = s.L;
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(N * L, 1));
  at::parallel_for(0, C, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      // Two passes over the channel (the second from L2): the sum of x - first, then the squared
      // deviations from the mean. Shifting by the channel's first value keeps a mean far from zero
      // (1e4 +- 1e-2) from rounding away the spread; the deviations are then exact differences.
      const T* base = x + c * L;
      const MVec first(static_cast<M>(base[0]));
      const double count = static_cast<double>(N * L);
      const auto [shifted] = channel_sums<T, 1>(base, N, C * L, L, [&](const T* p, int64_t i, int64_t k) {
        return std::array<MVec, 1>{first_lanes(load_lanes<T>(p + i, k) - first, k)};
      });
      const MVec d(static_cast<M>(shifted / count));
      const auto [m2] = channel_sums<T, 1>(base, N, C * L, L, [&](const T* p, int64_t i, int64_t k) {
        const MVec dev = (load_lanes<T>(p + i, k) - first) - d;
        return std::array<MVec, 1>{first_lanes(dev * dev, k)};
      });
      mean[c] = static_cast<M>(static_cast<double>(base[0]) + shifted / count);
      invstd[c] = static_cast<M>(1.0 / std::sqrt(m2 / count + eps));
      unbiased[c] = static_cast<M>(m2 / (count - 1));
      const M scale = w[c] * invstd[c];
      const M shift = b[c] - mean[c] * scale;
      for (int64_t n = 0; n < N; ++n) plane_affine<T>(y + (n * C + c) * L, x + (n * C + c) * L, L, scale, shift);
    }
  });
}

// Rows kernels walk a block of rows in strips of at most kStripVectors vectors of channels, the strip's
// accumulators in registers (P row phases of them for a narrow strip, so that several adds are in
// flight); the strip's last vector holds `last` lanes. Accumulators kept in memory instead (one
// load and store per vector and row) made each row wait on the previous row's store.
constexpr int kStripVectors = 8;

template <int NV>
constexpr int row_phases() {
  return NV >= 4 ? 1 : 4 / NV;
}

// f(std::integral_constant<int, NV>{}) for nv in [1, kStripVectors].
template <typename F>
inline void with_strip_width(int64_t nv, const F& f) {
  switch (nv) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

// For each strip of channels [j0, j0 + NV * W) of rows of C: f(NV constant, j0, last).
template <typename T, typename F>
inline void for_each_strip(int64_t C, const F& f) {
  constexpr int64_t W = OpmathVec<T>::size();
  for (int64_t j0 = 0; j0 < C; j0 += kStripVectors * W) {
    const int64_t nv = std::min<int64_t>(kStripVectors, div_up(C - j0, W));
    const int64_t last = std::min(W, C - j0 - (nv - 1) * W);  // a strip before the last one is whole
    with_strip_width(nv, [&](auto NV) { f(NV, j0, last); });
  }
}

// Sums over rows [r0, r1) of NA terms for the NV vectors of a strip, into out[a][v]: term(o, v, k) gives
// the NA terms of the k lanes at element offset o (row r, channel j0 + v * W).
template <typename T, int NV, int NA, typename Term>
inline void strip_sums(std::array<std::array<OpmathVec<T>, NV>, NA>& out, int64_t C, int64_t r0, int64_t r1, int64_t j0,
                       int64_t last, const Term& term) {
  using MVec = OpmathVec<T>;
  constexpr int64_t W = MVec::size();
  constexpr int P = row_phases<NV * NA>();
  std::array<std::array<std::array<MVec, NV>, NA>, P> acc;
  for (auto& phase : acc) {
    for (auto& sums : phase) sums.fill(MVec(0));
  }
  auto add_row = [&](std::array<std::array<MVec, NV>, NA>& a, int64_t r) {
    static_for<NV>([&](auto v) {
      const std::array<MVec, NA> t = term(r * C + j0 + v * W, v, v + 1 == NV ? last : W);
      static_for<NA>([&](auto i) { a[i][v] = a[i][v] + t[i]; });
    });
  };
  int64_t r = r0;
  for (; r + P <= r1; r += P) static_for<P>([&](auto p) { add_row(acc[p], r + p); });
  for (; r < r1; ++r) add_row(acc[0], r);
  static_for<NA>([&](auto i) {
    static_for<NV>([&](auto v) {
      MVec sum = acc[0][i][v];
      static_for<P - 1>([&](auto p) { sum = sum + acc[p + 1][i][v]; });
      out[i][v] = sum;
    });
  });
}

// Training statistics of a rows tensor (R rows of C): per-block (mean, M2) partials, merged in order.
template <typename T>
void rows_statistics(const T* x, const BatchNormShape& s, double eps, opmath_t<T>* mean, opmath_t<T>* invstd,
                     opmath_t<T>* unbiased) {
  using M = opmath_t<T>;
  using MVec = OpmathVec<T>;
  constexpr int64_t W = MVec::size();
  const int64_t R = s.N * s.L, C = s.C;
  const int64_t B = block_rows(C), blocks = div_up(R, B);
  // Per block and channel: the block's first row (the shift), its mean minus that row, and its M2.
  std::vector<M> part_first(static_cast<size_t>(blocks * C)), part_mean(static_cast<size_t>(blocks * C)),
      part_m2(static_cast<size_t>(blocks * C));
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t r0 = blk * B, r1 = std::min(R, r0 + B);
      M* pk = part_first.data() + blk * C;
      M* pm = part_mean.data() + blk * C;
      M* pq = part_m2.data() + blk * C;
      // Two passes per strip: the sum of x - the block's first row, then the squared deviations
      // from the block's mean (the block, at most kBlockElements, is read again from L1/L2).
      // Shifted by the first row, as the planes are by their first value.
      const M inv_rows = static_cast<M>(1) / static_cast<M>(r1 - r0);
      for_each_strip<T>(C, [&](auto NVc, int64_t j0, int64_t last) {
        constexpr int NV = decltype(NVc)::value;
        auto lanes = [&](int v) { return v + 1 == NV ? last : W; };
        std::array<MVec, NV> first;
        std::array<std::array<MVec, NV>, 1> m, q;
        static_for<NV>([&](auto v) { first[v] = load_lanes<T>(x + r0 * C + j0 + v * W, lanes(v)); });
        strip_sums<T, NV, 1>(m, C, r0, r1, j0, last, [&](int64_t o, int v, int64_t k) {
          return std::array<MVec, 1>{load_lanes<T>(x + o, k) - first[v]};
        });
        static_for<NV>([&](auto v) { m[0][v] = m[0][v] * MVec(inv_rows); });
        strip_sums<T, NV, 1>(q, C, r0, r1, j0, last, [&](int64_t o, int v, int64_t k) {
          const MVec d = (load_lanes<T>(x + o, k) - first[v]) - m[0][v];
          return std::array<MVec, 1>{d * d};
        });
        static_for<NV>([&](auto v) {
          first[v].store(pk + j0 + v * W, lanes(v));
          m[0][v].store(pm + j0 + v * W, lanes(v));
          q[0][v].store(pq + j0 + v * W, lanes(v));
        });
      });
    }
  });
  at::parallel_for(0, C, 256, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      Moments moments;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t rows = std::min(R, (blk + 1) * B) - blk * B;
        const size_t at = static_cast<size_t>(blk * C + c);
        moments.merge(static_cast<double>(rows),
                      static_cast<double>(part_first[at]) + static_cast<double>(part_mean[at]),
                      static_cast<double>(part_m2[at]));
      }
      mean[c] = static_cast<M>(moments.mean);
      invstd[c] = static_cast<M>(1.0 / std::sqrt(moments.m2 / moments.count + eps));
      unbiased[c] = static_cast<M>(moments.m2 / (moments.count - 1));
    }
  });
}

// y = x * scale + shift per channel, any layout.
template <typename T>
void normalize(T* y, const T* x, const BatchNormShape& s, const opmath_t<T>* scale, const opmath_t<T>* shift) {
  const int64_t C = s.C, L = s.L;
  if (s.rows) {
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(C, 1));
    at::parallel_for(0, s.N * L, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) row_affine<T>(y + r * C, x + r * C, C, scale, shift);
    });
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(L, 1));
  at::parallel_for(0, s.N * C, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) plane_affine<T>(y + r * L, x + r * L, L, scale[r % C], shift[r % C]);
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm(const at::Tensor& x_in,
                                                                      const std::optional<at::Tensor>& weight,
                                                                      const std::optional<at::Tensor>& bias,
                                                                      const std::optional<at::Tensor>& running_mean,
                                                                      const std::optional<at::Tensor>& running_var,
                                                                      bool training, double eps) {
  check_bn_forward("batch_norm", x_in, weight, bias, running_mean, running_var, training, eps);
  const bool rows = bn_rows(x_in);
  const at::Tensor x = bn_layout(x_in, rows);
  const BatchNormShape s = bn_shape(x, rows);
  const auto stat_options = x.options().dtype(bn_compute_dtype(x));
  at::Tensor y = at::empty_like(x);
  at::Tensor mean = at::empty({s.C}, stat_options);
  at::Tensor invstd = at::empty({s.C}, stat_options);
  at::Tensor unbiased = at::empty({training ? s.C : 0}, stat_options);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_batch_norm_cpu", [&] {
    using M = opmath_t<scalar_t>;
    const int64_t C = s.C;
    M* pmean = mean.data_ptr<M>();
    M* pinv = invstd.data_ptr<M>();
    if (training && s.count() == 0) {  // torch.var_mean of nothing: NaN
      std::fill_n(pmean, C, std::numeric_limits<M>::quiet_NaN());
      std::fill_n(pinv, C, std::numeric_limits<M>::quiet_NaN());
      std::fill_n(unbiased.data_ptr<M>(), C, std::numeric_limits<M>::quiet_NaN());
      return;
    }
    const std::vector<M> w = per_channel<M>(weight, C, M(1)), b = per_channel<M>(bias, C, M(0));
    const scalar_t* px = x.const_data_ptr<scalar_t>();
    scalar_t* py = y.data_ptr<scalar_t>();
    if (training && !rows) {
      planes_forward_training<scalar_t>(py, px, s, w, b, eps, pmean, pinv, unbiased.data_ptr<M>());
      return;
    }
    if (training) {
      rows_statistics<scalar_t>(px, s, eps, pmean, pinv, unbiased.data_ptr<M>());
    } else {
      const std::vector<M> rm = per_channel<M>(running_mean, C, M(0)), rv = per_channel<M>(running_var, C, M(1));
      for (int64_t c = 0; c < C; ++c) {
        pmean[c] = rm[c];
        pinv[c] = static_cast<M>(1.0 / std::sqrt(static_cast<double>(rv[c]) + eps));
      }
    }
    std::vector<M> scale(static_cast<size_t>(C)), shift(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      scale[c] = w[c] * pinv[c];
      shift[c] = b[c] - pmean[c] * scale[c];
    }
    normalize<scalar_t>(py, px, s, scale.data(), shift.data());
  });
  return {y, mean, invstd, unbiased};
}

namespace {

// g - mean_dy - xm * k, which cancels to a small fraction of g (two elements per channel: to rounding
// noise). With an FMA the product is not rounded. At the DEFAULT level at::vec's fmadd rounds it, an
// error of half an ulp of g that the float32 contract bound (1e-5) does not leave room for: the
// rounding is taken back with the product's exact low part (Dekker's product, Veltkamp's split).
template <typename V>
inline V centered_grad(const V& g, const V& xm, const V& k, const V& mean_dy) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return g - at::vec::fmadd(xm, k, mean_dy);
#else
  using S = typename V::value_type;
  const V split(static_cast<S>(std::is_same_v<S, double> ? 134217729.0 : 4097.0));  // 2^(p/2) + 1
  const V p = xm * k;
  const V ca = xm * split, cb = k * split;
  const V ah = ca - (ca - xm), bh = cb - (cb - k);
  const V al = xm - ah, bl = k - bh;
  const V p_low = (((ah * bh - p) + ah * bl) + al * bh) + al * bl;  // xm * k - p, exactly
  return ((g - mean_dy) - p) - p_low;
#endif
}

// dx = (g - mean_dy - (x - mean) * k) * a per channel (k = 0, mean_dy = 0 in eval).
template <typename T>
struct InputGradFactors {
  const opmath_t<T>* mean;
  const opmath_t<T>* mean_dy;
  const opmath_t<T>* k;
  const opmath_t<T>* a;
};

template <typename T>
inline void plane_input_grad(T* dx, const T* g, const T* x, int64_t len, opmath_t<T> mean, opmath_t<T> mean_dy,
                             opmath_t<T> k, opmath_t<T> a) {
  using MVec = OpmathVec<T>;
  const MVec mv(mean), dyv(mean_dy), kv(k), av(a);
  write_lanes<T>(dx, len, [&](int64_t i, int64_t n) {
    return centered_grad(load_lanes<T>(g + i, n), load_lanes<T>(x + i, n) - mv, kv, dyv) * av;
  });
}

template <typename T>
inline void row_input_grad(T* dx, const T* g, const T* x, int64_t C, const InputGradFactors<T>& f) {
  using MVec = OpmathVec<T>;
  write_lanes<T>(dx, C, [&](int64_t j, int64_t n) {
    const MVec xm = load_lanes<T>(x + j, n) - MVec::loadu(f.mean + j, n);
    return centered_grad(load_lanes<T>(g + j, n), xm, MVec::loadu(f.k + j, n), MVec::loadu(f.mean_dy + j, n)) *
           MVec::loadu(f.a + j, n);
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_backward(const at::Tensor& grad_in, const at::Tensor& x_in,
                                                                   const std::optional<at::Tensor>& weight,
                                                                   const at::Tensor& mean_in,
                                                                   const at::Tensor& invstd_in, bool training,
                                                                   bool input_grad) {
  check_bn_backward("batch_norm_backward", grad_in, x_in, weight, mean_in, invstd_in);
  const bool rows = bn_rows(x_in);
  const at::Tensor x = bn_layout(x_in, rows);
  const at::Tensor g = match_layout(grad_in, x);
  const BatchNormShape s = bn_shape(x, rows);
  const at::Tensor mean = mean_in.contiguous(), invstd = invstd_in.contiguous();
  at::Tensor dx = input_grad ? at::empty_like(x) : at::empty({0}, x.options());
  at::Tensor dweight = at::empty({s.C}, mean.options());
  at::Tensor dbias = at::empty({s.C}, mean.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_batch_norm_backward_cpu", [&] {
    using M = opmath_t<scalar_t>;
    using MVec = OpmathVec<scalar_t>;
    constexpr int64_t W = MVec::size();
    const int64_t N = s.N, C = s.C, L = s.L;
    const M* pmean = mean.const_data_ptr<M>();
    const M* pinv = invstd.const_data_ptr<M>();
    const std::vector<M> w = per_channel<M>(weight, C, M(1));
    const scalar_t* px = x.const_data_ptr<scalar_t>();
    const scalar_t* pg = g.const_data_ptr<scalar_t>();
    scalar_t* pdx = input_grad ? dx.data_ptr<scalar_t>() : nullptr;
    M* pdw = dweight.data_ptr<M>();
    M* pdb = dbias.data_ptr<M>();
    const double count = static_cast<double>(s.count());
    // The factors of dx from a channel's two sums.
    auto factors = [&](int64_t c, double sum_dy, double sum_dy_xmu, M& mean_dy, M& k, M& a) {
      const double inv = pinv[c];
      pdw[c] = static_cast<M>(sum_dy_xmu * inv);
      pdb[c] = static_cast<M>(sum_dy);
      a = static_cast<M>(inv * w[c]);
      mean_dy = training ? static_cast<M>(sum_dy / count) : M(0);
      k = training ? static_cast<M>(sum_dy_xmu * inv * inv / count) : M(0);
    };
    if (!rows) {
      const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(N * L, 1));
      at::parallel_for(0, C, grain, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          const MVec mv(pmean[c]);
          // g's masked lanes are 0, so both terms are 0 there.
          const auto [sum_dy, sum_dy_xmu] =
              channel_sums<scalar_t, 2>(pg + c * L, N, C * L, L, [&](const scalar_t* p, int64_t i, int64_t k) {
                const MVec gv = load_lanes<scalar_t>(p + i, k);
                return std::array<MVec, 2>{gv, gv * (load_lanes<scalar_t>(px + (p - pg) + i, k) - mv)};
              });
          M mean_dy, k, a;
          factors(c, sum_dy, sum_dy_xmu, mean_dy, k, a);
          if (!input_grad) continue;
          for (int64_t n = 0; n < N; ++n) {
            const int64_t o = (n * C + c) * L;
            plane_input_grad<scalar_t>(pdx + o, pg + o, px + o, L, pmean[c], mean_dy, k, a);
          }
        }
      });
      return;
    }
    const int64_t R = N * L, B = block_rows(C), blocks = div_up(R, B);
    std::vector<M> part(static_cast<size_t>(blocks * 2 * C));
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t blk = begin; blk < end; ++blk) {
        const int64_t r0 = blk * B, r1 = std::min(R, r0 + B);
        M* pdy = part.data() + blk * 2 * C;  // the block's sums of g, then of g * (x - mean)
        M* pdyx = pdy + C;
        for_each_strip<scalar_t>(C, [&](auto NVc, int64_t j0, int64_t last) {
          constexpr int NV = decltype(NVc)::value;
          auto lanes = [&](int v) { return v + 1 == NV ? last : W; };
          std::array<MVec, NV> mv;
          std::array<std::array<MVec, NV>, 2> sums;  // of g, and of g * (x - mean)
          static_for<NV>([&](auto v) { mv[v] = MVec::loadu(pmean + j0 + v * W, lanes(v)); });
          strip_sums<scalar_t, NV, 2>(sums, C, r0, r1, j0, last, [&](int64_t o, int v, int64_t k) {
            // g's masked lanes are 0, so the product is 0 there.
            const MVec gv = load_lanes<scalar_t>(pg + o, k);
            return std::array<MVec, 2>{gv, gv * (load_lanes<scalar_t>(px + o, k) - mv[v])};
          });
          static_for<NV>([&](auto v) {
            sums[0][v].store(pdy + j0 + v * W, lanes(v));
            sums[1][v].store(pdyx + j0 + v * W, lanes(v));
          });
        });
      }
    });
    std::vector<M> mean_dy(static_cast<size_t>(C)), k(static_cast<size_t>(C)), a(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      double sum_dy = 0, sum_dy_xmu = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        sum_dy += part[blk * 2 * C + c];
        sum_dy_xmu += part[blk * 2 * C + C + c];
      }
      factors(c, sum_dy, sum_dy_xmu, mean_dy[c], k[c], a[c]);
    }
    if (!input_grad) return;
    const InputGradFactors<scalar_t> f{pmean, mean_dy.data(), k.data(), a.data()};
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(C, 1));
    at::parallel_for(0, R, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) row_input_grad<scalar_t>(pdx + r * C, pg + r * C, px + r * C, C, f);
    });
  });
  return {dx, dweight, dbias};
}

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
