// Elementwise CUDA loops with 16-byte vector loads.
//
// Each thread handles kUnroll vectors of 16 bytes, issuing all loads before the first use so several
// independent memory requests are in flight per thread. The grid covers the tensor in one pass, a
// block per kThreads x kUnroll vectors, as PyTorch's elementwise kernels do: blocks that finish
// make room for new ones, so loads of some blocks overlap the math and stores of others. (A grid of
// one resident wave looping over the tensor, our first design, kept its blocks in step, left a
// partial last iteration, and reached 61-63% of the copy roofline on the H200 where eager's GELU
// reached 75%.) Past 2^20 blocks the kernel loops.
// When any pointer is not 16-byte aligned (a view with an odd storage offset) the same kernel runs
// with one-element vectors. The last n % width elements go through a scalar tail in the same
// kernel. Indexing is 64-bit throughout. Math runs in opmath (float for fp16/bf16).
#pragma once

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <fastops/cuda_common.cuh>

#include <algorithm>
#include <array>
#include <cstdint>

namespace fastops::cuda {

constexpr int kUnroll = 4;

template <int NumIn, typename Op, typename M>
__device__ __forceinline__ M call_op(const Op& op, const M (&a)[NumIn]) {
  if constexpr (NumIn == 1) {
    return op(a[0]);
  } else if constexpr (NumIn == 2) {
    return op(a[0], a[1]);
  } else {
    static_assert(NumIn == 3, "1 to 3 inputs");
    return op(a[0], a[1], a[2]);
  }
}

template <typename T, int N, int NumIn, typename Op>
__global__ void __launch_bounds__(kThreads)
    elementwise_kernel(T* __restrict__ out, int64_t n, Op op, std::array<const T*, NumIn> in) {
  using opmath = at::opmath_type<T>;
  using V = Vector<T, N>;
  const int64_t num_vectors = n / N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads * kUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x; base < num_vectors;
       base += stride) {
    V loaded[NumIn][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + static_cast<int64_t>(u) * kThreads;
      if (v < num_vectors) {
#pragma unroll
        for (int k = 0; k < NumIn; ++k) loaded[k][u] = reinterpret_cast<const V*>(in[k])[v];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + static_cast<int64_t>(u) * kThreads;
      if (v < num_vectors) {
        V result;
#pragma unroll
        for (int j = 0; j < N; ++j) {
          opmath args[NumIn];
#pragma unroll
          for (int k = 0; k < NumIn; ++k) args[k] = static_cast<opmath>(loaded[k][u].val[j]);
          result.val[j] = static_cast<T>(call_op<NumIn>(op, args));
        }
        reinterpret_cast<V*>(out)[v] = result;
      }
    }
  }
  // Scalar tail: the last n % N elements, spread over the first block.
  if (blockIdx.x == 0) {
    for (int64_t i = num_vectors * N + threadIdx.x; i < n; i += kThreads) {
      opmath args[NumIn];
#pragma unroll
      for (int k = 0; k < NumIn; ++k) args[k] = static_cast<opmath>(in[k][i]);
      out[i] = static_cast<T>(call_op<NumIn>(op, args));
    }
  }
}

// Launches out[i] = op(in[0][i], ...) over n elements on the current stream. op takes and returns
// at::opmath_type<T>.
template <typename T, int NumIn, typename Op>
void launch_elementwise(T* out, int64_t n, const Op& op, std::array<const T*, NumIn> in) {
  if (n == 0) return;
  constexpr int kVec = kVectorWidth<T>;
  bool aligned = is_aligned16(out);
  for (const T* p : in) aligned = aligned && is_aligned16(p);
  const int64_t work_per_block = static_cast<int64_t>(kThreads) * kUnroll * (aligned ? kVec : 1);
  const int64_t needed = (n + work_per_block - 1) / work_per_block;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t blocks = std::clamp<int64_t>(needed, 1, int64_t{1} << 20);
  if (aligned) {
    elementwise_kernel<T, kVec, NumIn, Op><<<blocks, kThreads, 0, stream>>>(out, n, op, in);
  } else {
    elementwise_kernel<T, 1, NumIn, Op><<<blocks, kThreads, 0, stream>>>(out, n, op, in);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace fastops::cuda
