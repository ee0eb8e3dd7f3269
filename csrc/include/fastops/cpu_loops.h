// Vectorized, multi-threaded elementwise loops for the CPU kernels.
//
// The op is written once as a functor on at::vec::Vectorized<opmath_t<T>> (float for fp16/bf16/fp32,
// double for fp64). fp16/bf16 are widened to two float vectors on load and narrowed on store, so the
// math always runs in fp32. Tails use the partial load/store of Vectorized, so every element goes
// through the same vector code (no scalar twin that could round differently).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <fastops/cpu_vec_math.h>

#include <algorithm>
#include <array>
#include <tuple>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {

// Elements per grain of at::parallel_for: large enough to amortise a task, small enough to split
// a few-MB tensor across cores.
constexpr int64_t kElementwiseGrain = 32768;

template <int NumIn, typename Op, typename V>
C10_ALWAYS_INLINE V call_op(const Op& op, const std::array<V, NumIn>& a) {
  if constexpr (NumIn == 1) {
    return op(a[0]);
  } else if constexpr (NumIn == 2) {
    return op(a[0], a[1]);
  } else {
    static_assert(NumIn == 3, "1 to 3 inputs");
    return op(a[0], a[1], a[2]);
  }
}

// elementwise with narrow(lo, hi) -> Vectorized<T> as the fp32 -> fp16/bf16 conversion (with_narrowing).
template <typename T, int NumIn, typename Op, typename Narrow>
void elementwise_loop(T* out, int64_t n, const Op& op, const std::array<const T*, NumIn>& in, const Narrow& narrow) {
  using Vec = at::vec::Vectorized<T>;
  constexpr int64_t step = Vec::size();
  at::parallel_for(0, n, kElementwiseGrain, [&](int64_t begin, int64_t end) {
    // Local copies of the pointers: the stores through dst could otherwise alias the captured ones
    // (extensions build with -fno-strict-aliasing) and every iteration would reload them.
    T* const dst = out;
    const std::array<const T*, NumIn> src = in;
    const auto vector_at = [&](int64_t i, int64_t count) C10_ALWAYS_INLINE_ATTRIBUTE {
      if constexpr (is_reduced_float_v<T>) {
        using FVec = at::vec::Vectorized<float>;
        std::array<FVec, NumIn> lo, hi;
        for (int k = 0; k < NumIn; ++k) {
          std::tie(lo[k], hi[k]) = at::vec::convert_to_float<T>(Vec::loadu(src[k] + i, count));
        }
        narrow(call_op<NumIn>(op, lo), call_op<NumIn>(op, hi)).store(dst + i, count);
      } else {
        std::array<Vec, NumIn> args;
        for (int k = 0; k < NumIn; ++k) args[k] = Vec::loadu(src[k] + i, count);
        call_op<NumIn>(op, args).store(dst + i, count);
      }
    };
    // Whole vectors (count a constant, so loadu/store take their unmasked forms), then one partial.
    int64_t i = begin;
    for (; i + step <= end; i += step) vector_at(i, step);
    if (i < end) vector_at(i, end - i);
  });
}

// out[i] = op(in[0][i], ...) over n elements walked flat; op maps Vectorized<opmath_t<T>> arguments
// to one Vectorized<opmath_t<T>>.
template <typename T, int NumIn, typename Op>
void elementwise(T* out, int64_t n, const Op& op, std::array<const T*, NumIn> in) {
  with_narrowing<T>([&](const auto narrow) { elementwise_loop<T, NumIn>(out, n, op, in, narrow); });
}

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
