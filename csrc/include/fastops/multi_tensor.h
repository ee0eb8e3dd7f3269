// Host-side multi-tensor machinery: the CPU's counterpart of multi_tensor_apply.cuh, and the
// rounds that keep a tensor listed twice from being written twice at once on either device.
//
// The CPU kernels of a multi-tensor op (an optimizer step over whole lists of tensors) lay the
// tensors of one dtype end to end as one flat index space, and at::parallel_for splits that space
// evenly over the threads: a huge tensor is split, tiny ones are batched into one task, and empty
// tensors take no work wherever they are in the list.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <fastops/checks.h>

#include <algorithm>
#include <cstdint>
#include <utility>
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

// A tensor listed more than once (the same tensor object: torch warns about such param groups) is
// updated once per occurrence, in list order, as torch's CPU fused optimizers do. One parallel
// region (one launch on CUDA) must not hold two occurrences, or two threads would update the same
// elements at once: occurrence r of a tensor runs in round r, the rounds one after another. A call
// without repeats (nearly all) has one round.
struct Repeats {
  std::vector<size_t> first;  // first[i]: index of the first occurrence of tensors[i] (i if it is one)
  std::vector<int> round;     // round[i]: occurrences of tensors[i] before index i
  int rounds = 1;
};

inline Repeats find_repeats(at::TensorList tensors) {
  const size_t n = tensors.size();
  Repeats r;
  r.first.resize(n);
  r.round.assign(n, 0);
  std::vector<std::pair<const c10::TensorImpl*, size_t>> order(n);
  for (size_t i = 0; i < n; ++i) {
    order[i] = {tensors[i].unsafeGetTensorImpl(), i};
    r.first[i] = i;
  }
  // Sorted by object, then by index: the occurrences of one tensor are neighbours, in list order.
  std::sort(order.begin(), order.end());
  for (size_t k = 1; k < n; ++k) {
    if (order[k].first != order[k - 1].first) continue;
    const size_t i = order[k].second, prev = order[k - 1].second;
    r.first[i] = r.first[prev];
    r.round[i] = r.round[prev] + 1;
    r.rounds = std::max(r.rounds, r.round[i] + 1);
  }
  return r;
}

// Throws when two different tensors of the list (first occurrences only) share memory: two views of
// one buffer updated in one parallel region would race. The tensors must be dense.
inline void check_disjoint(const char* op, const char* arg, const std::vector<at::Tensor>& tensors,
                           const std::vector<size_t>& first) {
  struct Span {
    uintptr_t begin, end;  // bytes
    size_t index;
    bool operator<(const Span& o) const { return begin < o.begin || (begin == o.begin && index < o.index); }
  };
  std::vector<Span> spans;
  spans.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    if (first[i] != i || t.numel() == 0) continue;
    TORCH_INTERNAL_ASSERT(t.is_non_overlapping_and_dense());
    const auto begin = reinterpret_cast<uintptr_t>(t.const_data_ptr());
    spans.push_back({begin, begin + static_cast<uintptr_t>(t.numel()) * t.element_size(), i});
  }
  std::sort(spans.begin(), spans.end());
  // The span reaching furthest so far: any later span starting before its end overlaps it.
  for (size_t k = 1, reach = 0; k < spans.size(); ++k) {
    const Span& s = spans[k];
    const size_t other = spans[reach].index;
    TORCH_CHECK(s.begin >= spans[reach].end, "fastops.", op, ": ", arg, "[",
                str(static_cast<int64_t>(std::min(other, s.index))), "] and ", arg, "[",
                str(static_cast<int64_t>(std::max(other, s.index))),
                "] share memory; each must be a tensor of its own (the same tensor listed twice is updated once "
                "per occurrence)");
    if (s.end > spans[reach].end) reach = k;
  }
}

}  // namespace fastops::multi_tensor
