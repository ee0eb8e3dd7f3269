// Host-side multi-tensor machinery: the CPU's counterpart of multi_tensor_apply.cuh.
//
// The CPU kernels of a multi-tensor op (an optimizer step over whole lists of tensors) lay the
// tensors of one dtype end to end as one flat index space, and at::parallel_for splits that space
// evenly over the threads: a huge tensor is split, tiny ones are batched into one task, and empty
// tensors take no work wherever they are in the list.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace fastops::multi_tensor {

// Calls f(k, begin, end) on elements [begin, end) of tensor k, over every element of every tensor,
// in parallel tasks of about `grain` elements; offsets[k] is the first flat index of tensor k and
// offsets.back() the total. A task that spans several tensors calls f once for each, in order.
template <typename F>
void parallel_over_tensors(const std::vector<int64_t>& offsets, int64_t grain, const F& f) {
  const int64_t total = offsets.back();
  if (total == 0) return;
  at::parallel_for(0, total, grain, [&](int64_t begin, int64_t end) {
    // The last tensor starting at or before `begin`: empty tensors share their offset with the next
    // non-empty one, and upper_bound steps past them.
    size_t k = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
    for (int64_t pos = begin; pos < end; ++k) {
      const int64_t stop = std::min(end, offsets[k + 1]);
      if (stop > pos) {
        f(k, pos - offsets[k], stop - offsets[k]);
        pos = stop;
      }
    }
  });
}

}  // namespace fastops::multi_tensor
