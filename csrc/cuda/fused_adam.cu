// fused_adam_ on CUDA: one Adam / AdamW step over whole lists of tensors (math: cpu/fused_adam.cpp).
//
// The op entry point: checks, dtype and variant dispatch, and one multi-tensor apply per dtype of the
// Adam functor (include/fastops/adam_functor.cuh) over the tensors of that dtype. Strategy
// (include/fastops/multi_tensor_apply.cuh): chunks of 16384 elements, one block of 256 threads a
// chunk, the table of tensors in the kernel's argument block (613 tensors a launch, 532 with
// amsgrad; 72 / 62 before CUDA 12.1), 16-byte vectors where a tensor's four or five pointers are
// aligned. step, grad_scale, found_inf and an lr tensor on the device are read on the device: no host
// sync, so a step can be captured in a CUDA graph. An lr tensor in host memory is read (and checked)
// on the host at every step, as on the CPU. When *found_inf != 0 every block returns before touching
// memory, and the step counters (incremented by a second small kernel after the update) stay as they
// were. A param listed twice is updated once per occurrence, the occurrences in successive launches
// (rounds), never two in one. Bytes per element: 7 * sizeof(T) (28 B fp32: read p, g, m, v; write
// p, m, v); amsgrad + 2 * sizeof(T), grad_scale + sizeof(T). At 3.35 TB/s (H100 SXM) 124M fp32
// params take ~1.0 ms.
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <fastops/adam.h>
#include <fastops/checks.h>
#include <torch/library.h>
#include <fastops/adam_functor.cuh>
#include <fastops/cuda_common.cuh>
#include <fastops/multi_tensor_apply.cuh>

#include <array>
#include <vector>

namespace fastops::cuda {
namespace {

// The capacities the header comment and docs/fused_adam.md state.
constexpr bool kLargeArgs = mta::kArgBytes == 32764;
static_assert(mta::TensorTable<4, const float*>::kCapacity == (kLargeArgs ? 613 : 72) &&
                  mta::TensorTable<5, const float*>::kCapacity == (kLargeArgs ? 532 : 62),
              "multi-tensor table capacity changed");

template <typename T>
void launch_dtype(const adam::Work& w, const std::vector<size_t>& idx, const adam::Hyper& h, const AdamArgs& args,
                  cudaStream_t stream) {
  adam::dispatch_variant(h, [&](auto decay, auto amsgrad) {
    using Functor = AdamFunctor<T, decltype(decay)::value, decltype(amsgrad)::value>;
    std::array<const std::vector<at::Tensor>*, Functor::kLists> lists;
    if constexpr (decltype(amsgrad)::value) {
      lists = {&w.params, &w.exp_avgs, &w.exp_avg_sqs, &w.max_exp_avg_sqs, &w.grads};
    } else {
      lists = {&w.params, &w.exp_avgs, &w.exp_avg_sqs, &w.grads};
    }
    mta::multi_tensor_apply<Functor>(
        lists, idx, [&](size_t i) { return w.steps[i].const_data_ptr<float>(); }, args, stream);
  });
}

// A 1-element float32 tensor on `device` (an asynchronous device-side cast/copy when it is not one).
at::Tensor device_scalar(const char* arg, const at::Tensor& t, const at::Device& device) {
  TORCH_CHECK(t.numel() == 1 && at::isFloatingType(t.scalar_type()), "fastops.fused_adam_: expected ", arg,
              " to be a 1-element floating tensor, got ", str(t.scalar_type()), " with ", str(t.numel()), " elements");
  TORCH_CHECK(t.device() == device, "fastops.fused_adam_: expected ", arg, " on ", str(device), ", got ",
              str(t.device()));
  return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
}

void fused_adam_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList max_exp_avg_sqs, at::TensorList steps, const std::optional<at::Tensor>& lr_tensor,
                 double lr, double beta1, double beta2, double weight_decay, double eps, bool amsgrad, bool maximize,
                 bool decoupled_weight_decay, const std::optional<at::Tensor>& grad_scale,
                 const std::optional<at::Tensor>& found_inf) {
  adam::Hyper h{lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, decoupled_weight_decay};
  // An lr tensor in host memory is read and checked here, like a float lr; one on the device is read
  // by the kernel and not checked (that would be a host sync): the optimizer checks it when the
  // group is made, as torch does.
  const bool lr_on_device = lr_tensor.has_value() && !lr_tensor->device().is_cpu();
  if (lr_tensor.has_value() && !lr_on_device) h.lr = adam::host_scalar("lr", *lr_tensor);
  adam::check_hyper(h);
  if (params.empty()) return;
  const c10::cuda::CUDAGuard guard(params[0].device());
  const at::Device device = params[0].device();
  const bool unscale = grad_scale.has_value();
  adam::Work w = adam::prepare(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, amsgrad, unscale);
  // Keep the converted scalars alive until the launches are queued.
  at::Tensor lr_dev, scale_dev, inf_dev;
  AdamArgs args{h.lr, beta1, beta2, weight_decay, eps, nullptr, nullptr, nullptr, maximize};
  if (lr_on_device) {
    lr_dev = device_scalar("lr", *lr_tensor, device);
    args.lr_ptr = lr_dev.const_data_ptr<float>();
  }
  if (unscale) {
    scale_dev = device_scalar("grad_scale", *grad_scale, device);
    args.grad_scale = scale_dev.const_data_ptr<float>();
  }
  if (found_inf.has_value()) {
    inf_dev = device_scalar("found_inf", *found_inf, device);
    args.found_inf = inf_dev.const_data_ptr<float>();
  }
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  // A param listed k times is updated k times, in list order, each time with t = step + k, and its
  // step ends k higher (torch's fused Adam adds 1 to every listed step before its kernel runs). Its
  // later occurrences run in later rounds, so no launch holds it twice (two blocks would race on it);
  // their steps are counted first, one launch a round (two threads must not add to one step), and
  // every first occurrence's after the update, as for a param listed once.
  for (int r = 1; r < w.repeats.rounds; ++r) {
    mta::increment_counters<float>(adam::steps_of_round(w, r), args.found_inf, stream);
  }
  // One multi-tensor apply per (round, dtype), rounds in order. No structured binding: capturing one in
  // a lambda is C++20, and builds against an older torch are C++17 (nvcc warning #3357).
  for (const auto& entry : adam::groups(w)) {
    const std::vector<size_t>& idx = entry.second;
    // fp32, fp16, bf16 only: prepare() rejected fp64 on CUDA.
    FASTOPS_DISPATCH_FLOAT_HALF_BF16(entry.first.second, "fastops_fused_adam_cuda",
                                     [&] { launch_dtype<scalar_t>(w, idx, h, args, stream); });
  }
  if (w.repeats.rounds == 1) {
    mta::increment_counters<float>(w.steps, args.found_inf, stream);
  } else {
    mta::increment_counters<float>(adam::steps_of_round(w, 0), args.found_inf, stream);
  }
  w.finish();
}

}  // namespace
}  // namespace fastops::cuda

TORCH_LIBRARY_IMPL(fastops, CUDA, m) { m.impl("fused_adam_", &fastops::cuda::fused_adam_); }
