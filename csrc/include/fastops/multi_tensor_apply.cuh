// Multi-tensor apply: one kernel launch runs a functor over the chunks of many tensors.
//
// A call hands over kLists parallel lists of tensors (Adam: param, exp_avg, exp_avg_sq, grad): tensor i
// of every list has the numel and the memory order of lists[0][i], so all are indexed flat. The
// tensors are cut into chunks of kChunk elements and one block of kThreads threads runs the functor
// on one chunk, so a launch covers many tensors and a huge tensor spreads over the whole GPU. The
// table of tensors travels in the kernel's argument block (__grid_constant__: read in place, never
// copied): per tensor the kLists base pointers, one value of the functor's choosing (PerTensor; Adam:
// its step pointer), numel, the prefix sum of chunk counts, from which a block finds its tensor by
// binary search, and a flag saying that all kLists pointers are 16-byte aligned. With CUDA >= 12.1
// the argument block may hold 32764 bytes (with an 8-byte PerTensor: 613 tensors a launch for 4
// lists, 532 for 5), before that 4 KB (72 / 62); longer lists take more launches, queued in order on
// one stream. Empty tensors get no chunk at all, wherever they are in the list (an empty last tensor
// does not end the launch early). Indices are 64-bit within a tensor; the blocks of one launch stay
// below 2^31.
//
// A functor is a default-constructible struct with
//   static constexpr int kLists;   the number of tensor lists
//   using PerTensor = ...;         trivially copyable; one per tensor, in the table
//   using Args = ...;              trivially copyable; the per-call arguments, one copy per launch
//   __device__ void operator()(const mta::Chunk<kLists, PerTensor>& chunk, const Args& args) const;
// operator() runs on all kThreads threads of the block, which share one chunk. An elementwise update
// hands its per-element math to mta::for_each_element (16-byte vector loads and stores when the
// chunk is aligned); a functor that needs more (a reduction) reads the chunk itself.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <fastops/checks.h>
#include <fastops/cuda_loops.cuh>

#include <array>
#include <cstdint>
#include <vector>

#if defined(CUDART_VERSION) && CUDART_VERSION >= 11070
#define FASTOPS_GRID_CONSTANT __grid_constant__
#else
#define FASTOPS_GRID_CONSTANT
#endif

namespace fastops::cuda::mta {

// Bytes of kernel arguments a launch may pass: 32764 from CUDA 12.1 (Volta and newer), else 4096.
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12010
constexpr int64_t kArgBytes = 32764;
#else
constexpr int64_t kArgBytes = 4096;
#endif
constexpr int64_t kArgReserve = 256;  // the functor's Args and padding
constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;  // elements per block: 16 vector iterations of 256 threads (fp32)

template <int kLists, typename PerTensor>
struct TensorTable {
  // per tensor: the pointers, the PerTensor value, numel, chunk prefix (int32) and alignment flag
  static constexpr int kCapacity =
      static_cast<int>((kArgBytes - kArgReserve - 16) / (8 * kLists + sizeof(PerTensor) + 8 + 4 + 1));
  void* ptr[kCapacity][kLists];
  PerTensor per_tensor[kCapacity];
  int64_t numel[kCapacity];
  int32_t first_chunk[kCapacity + 1];  // first_chunk[k]: first block of tensor k; [size]: total blocks
  uint8_t aligned[kCapacity];
  int32_t size;
};

// The work of one block: elements [begin, begin + size) of tensor `tensor` of the launch.
template <int kLists, typename PerTensor>
struct Chunk {
  int tensor;            // index in this launch's table
  int64_t begin;         // first element of the chunk in its tensor
  int64_t size;          // elements in the chunk, 1 to kChunk
  void* ptr[kLists];     // the tensor's base pointer in each list
  PerTensor per_tensor;  // the tensor's value from the table
  bool aligned;          // every ptr is 16-byte aligned: 16-byte vectors may be used

  // The chunk's first element in list l.
  template <typename T>
  __device__ __forceinline__ T* data(int l) const {
    return static_cast<T*>(ptr[l]) + begin;
  }
};

// args is a plain by-value parameter, not __grid_constant__: with it nvcc stops unswitching the
// element loops on the functor's runtime flags (Adam's maximize and grad_scale), and every element
// pays for the branches.
template <typename Functor>
__global__ void __launch_bounds__(kThreads) multi_tensor_apply_kernel(
    const FASTOPS_GRID_CONSTANT TensorTable<Functor::kLists, typename Functor::PerTensor> table,
    const typename Functor::Args args) {
  const int32_t block = static_cast<int32_t>(blockIdx.x);
  // The tensor of this block: the last k with first_chunk[k] <= block (uniform over the block).
  int lo = 0, hi = table.size - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (table.first_chunk[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  Chunk<Functor::kLists, typename Functor::PerTensor> chunk;
  chunk.tensor = lo;
  chunk.begin = static_cast<int64_t>(block - table.first_chunk[lo]) * kChunk;
  chunk.size = min(kChunk, table.numel[lo] - chunk.begin);
#pragma unroll
  for (int l = 0; l < Functor::kLists; ++l) chunk.ptr[l] = table.ptr[lo][l];
  chunk.per_tensor = table.per_tensor[lo];
  chunk.aligned = table.aligned[lo] != 0;
  Functor{}(chunk, args);
}

// Runs op over the elements of one chunk. op(x) gets element i of every list as opmath values,
// x[l] from list l, and updates them in place; x[l] is stored back to list l where store[l] is set.
// Aligned chunks move 16 bytes per load and store, then the last size % (16 / sizeof(T)) elements go
// one by one; unaligned chunks go element by element. Threads of the block stride by kThreads.
template <typename T, int kLists, typename PerTensor, typename Op>
__device__ __forceinline__ void for_each_element(const Chunk<kLists, PerTensor>& chunk, const bool (&store)[kLists],
                                                 const Op& op) {
  using M = at::opmath_type<T>;
  T* ptr[kLists];
#pragma unroll
  for (int l = 0; l < kLists; ++l) ptr[l] = chunk.template data<T>(l);
  const int64_t n = chunk.size;
  int64_t scalar_from = 0;
  if (chunk.aligned) {
    constexpr int kVec = 16 / sizeof(T);
    using V = Vector<T, kVec>;
    const int64_t num_vec = n / kVec;
    for (int64_t i = threadIdx.x; i < num_vec; i += kThreads) {
      V vec[kLists];
#pragma unroll
      for (int l = 0; l < kLists; ++l) vec[l] = reinterpret_cast<const V*>(ptr[l])[i];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        M x[kLists];
#pragma unroll
        for (int l = 0; l < kLists; ++l) x[l] = static_cast<M>(vec[l].val[j]);
        op(x);
#pragma unroll
        for (int l = 0; l < kLists; ++l) vec[l].val[j] = static_cast<T>(x[l]);
      }
#pragma unroll
      for (int l = 0; l < kLists; ++l) {
        if (store[l]) reinterpret_cast<V*>(ptr[l])[i] = vec[l];
      }
    }
    scalar_from = num_vec * kVec;
  }
  // Unaligned chunks run whole here (64 elements a thread): unrolled by 4, as nvcc does on its own
  // for one optimizer's body but not always once it is inlined through this template.
#pragma unroll 4
  for (int64_t i = scalar_from + threadIdx.x; i < n; i += kThreads) {
    M x[kLists];
#pragma unroll
    for (int l = 0; l < kLists; ++l) x[l] = static_cast<M>(ptr[l][i]);
    op(x);
#pragma unroll
    for (int l = 0; l < kLists; ++l) {
      if (store[l]) ptr[l][i] = static_cast<T>(x[l]);
    }
  }
}

// Queues Functor over tensors idx[0], idx[1], ... of `lists` on `stream`: lists[l] points to list l
// (all lists indexed alike), and per_tensor_of(i) gives tensor i's PerTensor value. As many launches
// as the table needs, in list order.
template <typename Functor, typename PerTensorOf>
void multi_tensor_apply(const std::array<const std::vector<at::Tensor>*, Functor::kLists>& lists,
                        const std::vector<size_t>& idx, const PerTensorOf& per_tensor_of,
                        const typename Functor::Args& args, cudaStream_t stream) {
  constexpr int kLists = Functor::kLists;
  using Table = TensorTable<kLists, typename Functor::PerTensor>;
  static_assert(sizeof(Table) + sizeof(typename Functor::Args) <= kArgBytes, "kernel arguments exceed the limit");
  Table table;
  table.size = 0;
  int64_t blocks = 0;
  auto launch = [&] {
    if (table.size == 0) return;
    table.first_chunk[table.size] = static_cast<int32_t>(blocks);
    multi_tensor_apply_kernel<Functor><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table, args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    table.size = 0;
    blocks = 0;
  };
  for (size_t i : idx) {
    const int64_t numel = (*lists[0])[i].numel();
    if (numel == 0) continue;  // no chunk, and no effect on where the launch ends
    const int64_t chunks = (numel + kChunk - 1) / kChunk;
    // Blocks of one launch stay below 2^31 (the grid limit and the int32 prefix sums).
    if (table.size == Table::kCapacity || blocks + chunks > INT32_MAX) launch();
    TORCH_CHECK(chunks <= INT32_MAX, "fastops multi_tensor_apply: a tensor of ", str(numel), " elements is too large");
    const int s = table.size;
    bool aligned = true;
    for (int l = 0; l < kLists; ++l) {
      void* ptr = (*lists[l])[i].data_ptr();
      table.ptr[s][l] = ptr;
      aligned = aligned && is_aligned16(ptr);
    }
    table.per_tensor[s] = per_tensor_of(i);
    table.numel[s] = numel;
    table.first_chunk[s] = static_cast<int32_t>(blocks);
    table.aligned[s] = aligned ? 1 : 0;
    table.size = s + 1;
    blocks += chunks;
  }
  launch();
}

// Step counters: each 1-element tensor of type C += 1, unless *found_inf != 0 (found_inf may be
// null), in one small launch per kCapacity counters. Stream order places them against the updates
// (Adam queues them after its launches, which so read the counts from before the call).
template <typename C>
struct CounterTable {
  static constexpr int kCapacity = static_cast<int>((kArgBytes - kArgReserve) / sizeof(C*));
  C* counter[kCapacity];
  int32_t size;
};

template <typename C>
__global__ void increment_kernel(const FASTOPS_GRID_CONSTANT CounterTable<C> table, const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  for (int i = threadIdx.x; i < table.size; i += blockDim.x) *table.counter[i] += C(1);
}

// The counters must be distinct tensors: two threads adding to one number would race.
template <typename C>
void increment_counters(at::ArrayRef<at::Tensor> counters, const float* found_inf, cudaStream_t stream) {
  CounterTable<C> table;
  table.size = 0;
  auto launch = [&] {
    if (table.size == 0) return;
    increment_kernel<C><<<1, kThreads, 0, stream>>>(table, found_inf);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    table.size = 0;
  };
  for (const at::Tensor& c : counters) {
    if (table.size == CounterTable<C>::kCapacity) launch();
    table.counter[table.size++] = c.data_ptr<C>();
  }
  launch();
}

}  // namespace fastops::cuda::mta
