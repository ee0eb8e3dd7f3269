// Vector math of the CPU kernels, on at::vec (never include from .cu files).
//
// Every CPU op computes in opmath: fp32 for fp16/bf16/fp32 inputs, fp64 for fp64 (gradcheck).
// fp16/bf16 are widened to fp32 vectors on load and narrowed on store (load_opmath, store_opmath,
// convert_row, store_row). static_for unrolls register blocks at compile time. The ISA helpers are
// one instruction where AVX2 / AVX-512 have it and plain at::vec arithmetic at the DEFAULT level:
// fnmadd, abs_min, square_low (the exact low part of a square) and gauss, exp(-u^2/2) to full fp32
// accuracy or to the ~1e-5 that fp16/bf16 outputs need.
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#if defined(CPU_CAPABILITY_AVX512)
#include <cpuid.h>
#endif
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>
#include <utility>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {

template <typename T>
inline constexpr bool is_reduced_float_v = std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>;

template <typename T>
using opmath_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
using OpmathVec = at::vec::Vectorized<opmath_t<T>>;

template <typename T>
constexpr int64_t opmath_vec_size() {
  return OpmathVec<T>::size();
}

inline int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return div_up(a, b) * b; }

// f(std::integral_constant<int, 0>{}), ..., f(std::integral_constant<int, N - 1>{}): a loop whose
// index is a compile-time constant in the body, so small arrays indexed by it can stay in registers
// (GCC does not always keep them there: see static_for_inlined below).
template <int N, typename F>
inline void static_for(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I>{}), ...);
  }(std::make_integer_sequence<int, N>{});
}

// static_for forced inline. Left to the inliner, GCC kept some arrays of vectors indexed by the loop
// constant (accumulators, weights) on the stack, with a load and a store around every FMA: forced, the
// NCHW channel-blocked rows and weight sums ran 1.05-2.1x faster (AVX-512, 7x7 kernels on 7x7 to
// 28x28 maps; git show 00da02d:benchmarks/results/depthwise_conv2d_cpu_nchw_inlined.md). Not the default: the
// channels_last kernels ran 20-40% slower forced (more register pressure in their row blocks).
template <int N, typename F>
C10_ALWAYS_INLINE void static_for_inlined(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>)
      C10_ALWAYS_INLINE_ATTRIBUTE { (f(std::integral_constant<int, I>{}), ...); }(std::make_integer_sequence<int, N>{});
}

// A kernel path's run-time switch: on unless the environment sets `name` to 0 (callers read it once,
// into a static). The switches exist for A/B runs of one build and for testing the other path.
inline bool switched_on(const char* name) {
  const char* env = std::getenv(name);
  return env == nullptr || std::string_view(env) != "0";
}

// ---- AVX512_BF16, where the CPU has it ---------------------------------------------------------
// The AVX-512 level does not assume the extension (Skylake-X to Ice Lake lack it): its instructions
// are inline assembly, used only where CPUID says the CPU has them (see the narrowing section below
// for how their rounding differs from at::vec's). FASTOPS_AVX512_BF16=0 in the environment (read
// once) turns them off, to test the other path.
#if defined(CPU_CAPABILITY_AVX512)
inline bool detect_avx512_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  // CPUID.(EAX=7, ECX=1):EAX bit 5 = AVX512_BF16 (the AVX-512 register state is already enabled: this
  // level runs only where avx512f is usable).
  if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) || !(eax & (1u << 5))) return false;
  return switched_on("FASTOPS_AVX512_BF16");
}

inline bool cpu_has_avx512_bf16() {
  static const bool has = detect_avx512_bf16();
  return has;
}

// 16 fp32 lanes narrowed to bf16 by VCVTNEPS2BF16 into out; false (out untouched) when a lane is
// subnormal, which the instruction reads as zero and at::vec rounds.
C10_ALWAYS_INLINE bool narrow_bf16_avx512(const __m512 v, __m256i& out) {
  if (C10_UNLIKELY(_mm512_fpclass_ps_mask(v, 0x20) != 0)) return false;  // 0x20: denormal
  asm("vcvtneps2bf16 %[in], %[out]" : [out] "=v"(out) : [in] "v"(v));
  return true;
}
#endif

// ---- loads and stores in opmath ------------------------------------------------------------------

template <typename T>
inline OpmathVec<T> load_opmath(const T* p) {
  if constexpr (is_reduced_float_v<T>) {
    at::vec::Vectorized<float> v;
    at::vec::load_to_float<T>(p, v);
    return v;
  } else {
    return OpmathVec<T>::loadu(p);
  }
}

template <typename T>
inline OpmathVec<T> load_opmath(const T* p, int64_t count) {
  if constexpr (is_reduced_float_v<T>) {
    // A masked load of count <= 16 halves, widened; the upper half of the wide vector is unused.
    return std::get<0>(at::vec::convert_to_float<T>(at::vec::Vectorized<T>::loadu(p, count)));
  } else {
    return OpmathVec<T>::loadu(p, count);
  }
}

template <typename T>
inline void store_opmath(T* p, const OpmathVec<T>& v, int64_t count) {
#if defined(CPU_CAPABILITY_AVX512)
  // One instruction instead of at::vec's integer rounding (~10 per vector), which made the bf16
  // depthwise forward's narrowing cost about as much as its FMAs. Unlike the elementwise loops
  // (with_narrowing, below), the test runs per vector: the callers are register-block templates, and
  // a narrowing parameter would double their instantiations for one predictable branch on a flag.
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    __m256i narrow;
    if (cpu_has_avx512_bf16() && narrow_bf16_avx512(v, narrow)) {
      if (count >= 16) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow);
      } else {
        _mm256_mask_storeu_epi16(p, static_cast<__mmask16>((1u << count) - 1), narrow);
      }
      return;
    }
  }
#endif
  if constexpr (is_reduced_float_v<T>) {
    constexpr int64_t n = at::vec::Vectorized<float>::size();
    at::vec::convert_from_float<T>(v, v).store(p, std::min(count, n));
  } else {
    v.store(p, count);
  }
}

// Converts n elements of T to A (the opmath type), vectorized.
template <typename T, typename A>
inline void convert_row(A* dst, const T* src, int64_t n) {
  using V = at::vec::Vectorized<A>;
  int64_t i = 0;
  for (; i + V::size() <= n; i += V::size()) load_opmath<T>(src + i).store(dst + i);
  for (; i < n; ++i) dst[i] = static_cast<A>(src[i]);
}

template <typename T, typename A>
inline void store_row(T* dst, const A* src, int64_t n) {
  using V = at::vec::Vectorized<A>;
  int64_t i = 0;
  for (; i + V::size() <= n; i += V::size()) store_opmath<T>(dst + i, V::loadu(src + i), V::size());
  for (; i < n; ++i) dst[i] = static_cast<T>(src[i]);
}

// ---- streaming (non-temporal) stores --------------------------------------------------------------
// A plain store of a line that is not in cache first reads it (read for ownership): writing an output
// far larger than the caches costs a read and a write of it. A streaming store writes the line
// without reading it, but leaves it out of the caches, so the op that reads the output next reads it
// from memory. The depthwise kernels stream fp32 outputs: NHWC where streaming_stores_pay, the NCHW
// channel-blocked path through an L1 staging block (stream_copy).

// Whether an fp32 output of `bytes`, written by `threads` threads, is worth streaming: at least 1.5x
// the L2 per thread. Measured on Zen 4 (2 MiB L2), depthwise forward + batch_norm: at 1 thread
// outputs of 6-57 MB 1.0-1.18x faster streamed, outputs of 0.75-2.4 MB 3-9% slower; at 2 threads 8 MB
// and 14 MB faster (1.17x, 1.07x), 6 MB and smaller 0-14% slower.
inline bool streaming_stores_pay(int64_t bytes, int64_t threads) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  static const int64_t l2_bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? int64_t(l2) : int64_t{1} << 20;
  }();
  return 2 * bytes >= 3 * l2_bytes * std::max<int64_t>(threads, 1);
#else
  (void)bytes, (void)threads;
  return false;  // the DEFAULT level has no streaming store in at::vec
#endif
}

// One whole vector to p, which must be aligned to the vector's size.
inline void stream_store(float* p, const at::vec::Vectorized<float>& v) {
#if defined(CPU_CAPABILITY_AVX512)
  _mm512_stream_ps(p, v);
#elif defined(CPU_CAPABILITY_AVX2)
  _mm256_stream_ps(p, v);
#else
  v.store(p);
#endif
}

// y[0, n) = src[0, n), in streaming stores where y is vector-aligned (else a plain copy).
inline void stream_copy(float* y, const float* src, int64_t n) {
  constexpr int64_t L = at::vec::Vectorized<float>::size();
  int64_t i = 0;
  if (reinterpret_cast<std::uintptr_t>(y) % (L * sizeof(float)) == 0) {
    for (; i + L <= n; i += L) stream_store(y + i, at::vec::Vectorized<float>::loadu(src + i));
  }
  std::copy(src + i, src + n, y + i);
}

// Orders a thread's streaming stores before what follows (other threads and the caller read the
// output next): call it at the end of each parallel task that streamed.
inline void stream_fence() {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  _mm_sfence();
#endif
}

// ---- fp32 -> fp16/bf16 narrowing of two vectors -------------------------------------------------
// The elementwise loops and the CPU Adam step narrow through a functor chosen once per call
// (with_narrowing), so that a faster instruction found at run time costs no test per vector.
//
// at::vec narrows fp32 to bf16 in integer arithmetic (round to nearest even, NaN to 0xFFFF): about 8
// instructions per 16 lanes plus a pack and a permute, a third of a bf16 gelu forward. AVX512_BF16's
// VCVTNE2PS2BF16 narrows two vectors in one instruction with the same rounding for every normal value
// (checked over 10^8 random normal patterns on a Zen 4). It differs in two cases: a NaN keeps its sign and
// payload (quieted; still a NaN, as torch's scalar conversion gives 0x7FC0 and its vector one 0xFFFF), and
// subnormal inputs are read as zero where rounding gives a subnormal bf16 (bf16 shares fp32's exponent
// range, so only subnormal fp32 values give subnormal bf16). A vector holding any subnormal lane
// (VFPCLASSPS) therefore takes at::vec's conversion. store_opmath narrows one vector the same way
// (VCVTNEPS2BF16, narrow_bf16_avx512).

template <typename T>
struct NarrowAtVec {
  C10_ALWAYS_INLINE at::vec::Vectorized<T> operator()(const at::vec::Vectorized<float>& lo,
                                                      const at::vec::Vectorized<float>& hi) const {
    return at::vec::convert_from_float<T>(lo, hi);
  }
};

#if defined(CPU_CAPABILITY_AVX512)
struct NarrowBf16Avx512 {
  C10_ALWAYS_INLINE at::vec::Vectorized<c10::BFloat16> operator()(const at::vec::Vectorized<float>& lo,
                                                                  const at::vec::Vectorized<float>& hi) const {
    const __m512 l = lo, h = hi;
    // 0x20: denormal.
    if (C10_UNLIKELY((_mm512_fpclass_ps_mask(l, 0x20) | _mm512_fpclass_ps_mask(h, 0x20)) != 0)) {
      return at::vec::convert_from_float<c10::BFloat16>(lo, hi);
    }
    __m512i out;
    // Intel order vcvtne2ps2bf16 dst, src1 (upper 16), src2 (lower 16); AT&T reverses the operands.
    asm("vcvtne2ps2bf16 %[lo], %[hi], %[out]" : [out] "=v"(out) : [lo] "v"(l), [hi] "v"(h));
    return out;
  }
};
#endif

// f(narrow) with narrow(lo, hi) -> Vectorized<T>: the AVX512_BF16 instruction for bf16 where the CPU has
// it, at::vec's conversion otherwise.
template <typename T, typename F>
C10_ALWAYS_INLINE void with_narrowing(const F& f) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (cpu_has_avx512_bf16()) {
      f(NarrowBf16Avx512{});
      return;
    }
  }
#endif
  f(NarrowAtVec<T>{});
}

// ---- fp32 ISA helpers ----------------------------------------------------------------------------

using FVec = at::vec::Vectorized<float>;

// at::vec::fmadd as a functor, for math written once for scalars and vectors (gelu_math::tail_poly).
struct VecFma {
  FVec operator()(const FVec& a, const FVec& b, const FVec& c) const { return at::vec::fmadd(a, b, c); }
};

// c - a*b in one instruction (at::vec's generic fnmadd is a multiply, a negation and an add).
inline FVec fnmadd(const FVec& a, const FVec& b, const FVec& c) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_fnmadd_ps(a, b, c);
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_fnmadd_ps(a, b, c);
#else
  return c - a * b;
#endif
}

// min(|x|, c) for c > 0 (NaN stays NaN): one VRANGEPS on AVX-512 (absolute minimum, sign cleared).
inline FVec abs_min(const FVec& x, const FVec& c) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_range_ps(x, c, 0x0A);
#else
  return at::vec::clamp_max(x.abs(), c);
#endif
}

// lo = u*u - hi exactly, for hi = u*u rounded: one FMA where the ISA has one; otherwise (the
// DEFAULT level, whose Vectorized fmsub is a rounded multiply and subtract) Dekker's product with
// Veltkamp's split of u into 12 + 12 bits, exact in plain fp32 arithmetic.
inline FVec square_low(const FVec& u, const FVec& hi) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  return at::vec::fmsub(u, u, hi);
#else
  const FVec c = u * FVec(4097.0f);
  const FVec uh = c - (c - u);
  const FVec ul = u - uh;
  return ((uh * uh - hi) + FVec(2.0f) * uh * ul) + ul * ul;
#endif
}

// Two accuracy levels of fp32 vector math. kFull: a few fp32 ulp (fp32 and fp64 outputs, and any
// result that later cancels). kReduced: ~1e-5 relative (the gelu erf bulk path ~1.5e-5, docs/gelu.md),
// over 100x below half an ulp of bf16 and 30x below fp16's, so the rounded fp16/bf16 result is the
// correctly rounded one except within that much of a tie.
enum class Accuracy { kFull, kReduced };

template <typename T>
constexpr Accuracy accuracy_for() {
  return is_reduced_float_v<T> ? Accuracy::kReduced : Accuracy::kFull;
}

// exp(-(hi + lo) / 2) for hi = u*u rounded and lo = u*u - hi exactly, u in [0, 20] (beyond, the
// result is 0 in fp32). kReduced: e^r of degree 4 (5.3e-6) and no low-part correction of u^2
// (< 4e-6 at u = 10). AVX-512 and AVX2: our own exp, specialised to this argument: n = round(a /
// ln2) with a = -hi/2 (exact), r = a - n ln2 - lo/2 (Cody-Waite with a 9-bit ln2_hi, so n * ln2_hi
// is exact for |n| <= 289), e^r by one Horner chain of degree 6 (1.1e-7 relative in fp32
// arithmetic; its last two steps add r and 1 with single roundings), times 2^n. AVX-512 scales with
// scalef, which rounds correctly into the subnormals and to 0 below them. AVX2 has no scalef: a is
// clamped at -174 (e^-174 is 0 in fp32, so the clamp changes no result), n >= -251, and 2^n is
// applied as two normal powers of two 2^(n/2) whose first product is exact, so the one rounding is
// the second's, into the subnormals or to 0 as scalef would. About 12 (AVX-512) / 20 (AVX2)
// instructions, inline, against a call of Sleef's general expf (~45 on AVX2) plus the lo
// correction. The DEFAULT level: Sleef's (or the scalar) expf, then a first-order lo correction.
// Our own fits (weighted least squares towards minimax, float64).
template <Accuracy kAcc>
inline FVec gauss(const FVec& u) {
  const FVec hi = u * u;
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#if defined(CPU_CAPABILITY_AVX512)
  const FVec a = hi * FVec(-0.5f);
  const FVec n(_mm512_roundscale_ps(a * FVec(1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  const FVec a = at::vec::maximum(hi * FVec(-0.5f), FVec(-174.0f));
  const FVec n(_mm256_round_ps(a * FVec(1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  FVec r = fnmadd(n, FVec(0.693359375f), a);
  r = fnmadd(n, FVec(-2.12194440e-4f), r);
  FVec er;
  if constexpr (kAcc == Accuracy::kFull) {
    r = at::vec::fmadd(square_low(u, hi), FVec(-0.5f), r);  // - lo/2, lo = u*u - hi exactly
    FVec p = at::vec::fmadd(FVec(1.3814610429e-03f), r, FVec(8.3687100559e-03f));
    p = at::vec::fmadd(p, r, FVec(4.1668388993e-02f));
    p = at::vec::fmadd(p, r, FVec(1.6666521132e-01f));
    p = at::vec::fmadd(p, r, FVec(4.9999994040e-01f));
    p = at::vec::fmadd(p, r, FVec(1.0f));
    er = at::vec::fmadd(p, r, FVec(1.0f));
  } else {
    FVec p = at::vec::fmadd(FVec(4.1277728975e-02f), r, FVec(1.6753514111e-01f));
    p = at::vec::fmadd(p, r, FVec(5.0005114079e-01f));
    p = at::vec::fmadd(p, r, FVec(1.0f));
    er = at::vec::fmadd(p, r, FVec(1.0f));
  }
#if defined(CPU_CAPABILITY_AVX512)
  return FVec(_mm512_scalef_ps(er, n));
#else
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const auto pow2 = [](__m256i k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
  };
  return FVec(_mm256_mul_ps(_mm256_mul_ps(er, pow2(n1)), pow2(n2)));
#endif
#else
  const FVec a = hi * FVec(-0.5f);
  const FVec e = a.exp();
  if constexpr (kAcc == Accuracy::kFull) {
    return at::vec::fmadd(e, square_low(u, hi) * FVec(-0.5f), e);
  } else {
    return e;
  }
#endif
}

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
