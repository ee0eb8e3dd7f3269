// Deterministic reductions of the CPU kernels.
//
// A kernel that reduces over many rows (bias_gelu's grad_bias, depthwise's weight gradient) cuts the
// rows into blocks whose number and size depend only on the shape, never on the thread count; each
// block writes one row of opmath partial sums, and sum_rows_in_order adds those rows in row order,
// vectorized across columns. The summation order, and with it every bit of the result, is then the
// same on every run and every machine with the same ISA.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {

// out[j] = rows[0][j] + rows[1][j] + ... + rows[count - 1][j] for j in [0, width), added in row
// order; rows is count x width, row-major, count >= 1.
template <typename A>
void sum_rows_in_order(const A* rows, int64_t count, int64_t width, A* out) {
  using V = at::vec::Vectorized<A>;
  at::parallel_for(0, width, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; j += V::size()) {
      const int64_t n = std::min<int64_t>(V::size(), end - j);
      V sum = V::loadu(rows + j, n);
      for (int64_t r = 1; r < count; ++r) sum = sum + V::loadu(rows + r * width + j, n);
      sum.store(out + j, n);
    }
  });
}

// The same over dim 0 of a contiguous fp32 or fp64 tensor of partial sums: the result has the
// shape of one row.
inline at::Tensor sum_rows_in_order(const at::Tensor& rows) {
  TORCH_INTERNAL_ASSERT(rows.dim() >= 1 && rows.size(0) >= 1 && rows.is_contiguous());
  at::Tensor out = at::empty(rows.sizes().slice(1), rows.options());
  AT_DISPATCH_FLOATING_TYPES(rows.scalar_type(), "fastops_sum_rows_in_order", [&] {
    sum_rows_in_order(rows.const_data_ptr<scalar_t>(), rows.size(0), out.numel(), out.data_ptr<scalar_t>());
  });
  return out;
}

// The sum of the lanes of one vector.
template <typename A>
inline A horizontal_sum(const at::vec::Vectorized<A>& v) {
  return at::vec::vec_reduce_all<A>([](const auto& a, const auto& b) { return a + b; }, v);
}

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
