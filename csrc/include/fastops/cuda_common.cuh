// What every fastops CUDA kernel shares: the dtype dispatch, the 16-byte vector type, the block
// size, the launch-grid helpers and the fixed-order sum of per-block partials.
//
// Vectors: a thread moves 16 bytes per load or store (4 fp32, 8 fp16/bf16) whenever the element
// count and every pointer allow it; vectorizable() is that test. Grids: a grid-stride kernel gets
// enough blocks to cover its items in one pass, capped at 2^20 blocks (grid_stride_blocks). Partial sums: kernels that
// reduce write one row of fp32 partials per block row; launch_sum_rows_in_order adds the rows in row order, so a result
// is bitwise reproducible for a given shape (no atomics).
#pragma once

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

// The dtypes of every CUDA kernel: fp32, fp16 and bf16. fp64 is rejected on CUDA by the checks
// (check_floating), so no fp64 kernel is ever instantiated.
#define FASTOPS_DISPATCH_FLOAT_HALF_BF16(TYPE, NAME, ...)                                               \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                                                        \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__) \
                         AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

namespace fastops::cuda {

// Threads per block of every fastops kernel.
constexpr int kThreads = 256;

template <typename T, int N>
struct alignas(sizeof(T) * N) Vector {
  T val[N];
};

// Elements of T in one 16-byte vector.
template <typename T>
constexpr int kVectorWidth = 16 / sizeof(T);

inline bool is_aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether rows of n elements of T can be walked in 16-byte vectors: n a multiple of the vector
// width and every pointer 16-byte aligned.
template <typename T>
bool vectorizable(int64_t n, std::initializer_list<const void*> ptrs) {
  if (n % kVectorWidth<T> != 0) return false;
  for (const void* p : ptrs) {
    if (!is_aligned16(p)) return false;
  }
  return true;
}

// Multiprocessor count of the current device, read once per device. (ATen/cuda/CUDAContext.h would
// give it too, but pulls cuBLAS/cuSPARSE headers into every .cu and slows compiles.)
inline int multiprocessor_count() {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};
  const int device = c10::cuda::current_device();
  if (device >= kMaxDevices) {
    int count = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }
  if (cached[device] == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&cached[device], cudaDevAttrMultiProcessorCount, device));
  }
  return cached[device];
}

// Blocks of kThreads for a grid-stride loop over `items`, one item a thread: enough to cover them,
// at most 2^20 (a thread then owns several items).
inline int64_t grid_stride_blocks(int64_t items) {
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  return std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{1} << 20));
}

// store(i, rows[0][i] + rows[1][i] + ... + rows[count-1][i]) for i in [0, width): rows of width
// fp32 partials, added in row order.
template <typename Store>
__global__ void __launch_bounds__(kThreads)
    sum_rows_in_order_kernel(const float* __restrict__ rows, int64_t count, int64_t width, Store store) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < width;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.f;
    for (int64_t r = 0; r < count; ++r) sum += rows[r * width + i];
    store(i, sum);
  }
}

template <typename Store>
void launch_sum_rows_in_order(const float* rows, int64_t count, int64_t width, Store store, cudaStream_t stream) {
  sum_rows_in_order_kernel<Store><<<grid_stride_blocks(width), kThreads, 0, stream>>>(rows, count, width, store);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The Store of launch_sum_rows_in_order that writes the sums as T.
template <typename T>
struct StoreAs {
  T* out;
  __device__ void operator()(int64_t i, float sum) const { out[i] = static_cast<T>(sum); }
};

}  // namespace fastops::cuda
