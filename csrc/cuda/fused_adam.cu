// fused_adam_ on CUDA: one Adam / AdamW step over whole lists of tensors (math: cpu/fused_adam.cpp).
//
// Strategy (multi-tensor apply): the tensors of one dtype are cut into chunks of kChunk elements and
// one block updates one chunk, so a launch covers many tensors and a huge tensor spreads over the
// whole GPU. The table of tensors travels in the kernel's argument block: base pointers of the
// 4 or 5 lists, the step pointer, numel, a 16-byte-alignment flag and the prefix sum of chunk
// counts, from which a block finds its tensor by binary search. With CUDA >= 12.1 the argument block
// may hold 32764 bytes (613 tensors a launch, 532 with amsgrad), before that 4 KB (72 / 62); longer lists take more
// launches. Empty tensors get no chunk at all, wherever they are in the list (an empty last tensor
// does not end the launch early). Aligned tensors move 16 bytes per load and store; others, and the
// last numel % vector-width elements, go element by element. Math in fp32, indices in 64 bits.
// step, grad_scale, found_inf and an lr tensor on the device are read on the device: no host sync,
// so a step can be captured in a CUDA graph. An lr tensor in host memory is read (and checked) on the
// host at every step, as on the CPU. When *found_inf != 0 every block returns before touching memory,
// and the step counters (incremented by a second small kernel after the update) stay as they were.
// Bytes per element: 7 * sizeof(T) (28 B fp32: read p, g, m, v; write p, m, v); amsgrad + 2 * sizeof(T),
// grad_scale + sizeof(T). At 3.35 TB/s (H100 SXM) 124M fp32 params take ~1.0 ms.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <fastops/adam.h>
#include <fastops/checks.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <map>

#if defined(CUDART_VERSION) && CUDART_VERSION >= 11070
#define FASTOPS_GRID_CONSTANT __grid_constant__
#else
#define FASTOPS_GRID_CONSTANT
#endif

namespace fastops::cuda {
namespace {

// Bytes of kernel arguments a launch may pass: 32764 from CUDA 12.1 (Volta and newer), else 4096.
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12010
constexpr int64_t kArgBytes = 32764;
#else
constexpr int64_t kArgBytes = 4096;
#endif
constexpr int64_t kArgReserve = 256;  // AdamArgs and padding
constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;  // elements per block: 16 vector iterations of 256 threads (fp32)

constexpr int64_t table_capacity(int lists) {
  // per tensor: the pointers, step pointer, numel, chunk prefix (int32) and alignment flag
  return (kArgBytes - kArgReserve - 16) / (8 * lists + 8 + 8 + 4 + 1);
}

template <int kLists>
struct TensorTable {
  static constexpr int kCapacity = static_cast<int>(table_capacity(kLists));
  void* ptr[kCapacity][kLists];  // param, grad, exp_avg, exp_avg_sq[, max_exp_avg_sq]
  const float* step[kCapacity];
  int64_t numel[kCapacity];
  int32_t first_chunk[kCapacity + 1];  // first_chunk[k]: first block of tensor k; [size]: total blocks
  uint8_t aligned[kCapacity];
  int32_t size;
};

struct AdamArgs {
  double lr, beta1, beta2, weight_decay, eps;
  const float* lr_ptr;      // replaces lr when set
  const float* grad_scale;  // divides the grads (written back unscaled) when set
  const float* found_inf;   // skips everything when set and nonzero
  bool maximize;
};

static_assert(sizeof(TensorTable<5>) + sizeof(AdamArgs) <= kArgBytes, "kernel arguments exceed the limit");
static_assert(sizeof(TensorTable<4>) + sizeof(AdamArgs) <= kArgBytes, "kernel arguments exceed the limit");

using adam::Decay;

// Broadcast coefficients of one tensor, computed in double from its own step and rounded once.
struct Coeffs {
  float grad_scale, weight_decay, decay_factor, lerp_coeff, beta2, one_minus_beta2, bias_correction2, eps,
      neg_step_size;
  bool unscale, maximize, lerp_from_start;
};

template <Decay kDecay, bool kAmsgrad>
__device__ __forceinline__ void adam_element(float& p, float& g, float& m, float& v, float& vmax, const Coeffs& c) {
  if (c.unscale) g = g / c.grad_scale;
  float grad = c.maximize ? -g : g;
  if constexpr (kDecay == Decay::kL2) grad = fmaf(p, c.weight_decay, grad);
  if constexpr (kDecay == Decay::kDecoupled) p = p * c.decay_factor;
  // torch's lerp: start + w * (end - start) for |w| < 0.5, else end - (1 - w) * (end - start).
  m = fmaf(c.lerp_coeff, grad - m, c.lerp_from_start ? m : grad);
  v = v * c.beta2;
  v = v + c.one_minus_beta2 * grad * grad;
  float second = v;
  if constexpr (kAmsgrad) {
    vmax = (v != v || v > vmax) ? v : vmax;  // NaN propagates, as torch.maximum
    second = vmax;
  }
  const float denom = sqrtf(second) / c.bias_correction2 + c.eps;
  p = p + c.neg_step_size * (m / denom);
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T val[N];
};

template <typename T, int kLists, Decay kDecay, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads)
    adam_kernel(const FASTOPS_GRID_CONSTANT TensorTable<kLists> table, const AdamArgs args) {
  if (args.found_inf != nullptr && *args.found_inf != 0.0f) return;
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
  const int k = lo;
  const int64_t begin = static_cast<int64_t>(block - table.first_chunk[k]) * kChunk;
  const int64_t n = min(kChunk, table.numel[k] - begin);

  const double lr = args.lr_ptr != nullptr ? static_cast<double>(*args.lr_ptr) : args.lr;
  const double t = static_cast<double>(*table.step[k]) + 1.0;
  Coeffs c;
  c.unscale = args.grad_scale != nullptr;
  c.grad_scale = c.unscale ? *args.grad_scale : 1.0f;
  c.maximize = args.maximize;
  c.weight_decay = static_cast<float>(args.weight_decay);
  c.decay_factor = static_cast<float>(1.0 - lr * args.weight_decay);
  const float w = static_cast<float>(1.0 - args.beta1);
  c.lerp_from_start = fabsf(w) < 0.5f;
  c.lerp_coeff = c.lerp_from_start ? w : w - 1.0f;
  c.beta2 = static_cast<float>(args.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - args.beta2);
  c.bias_correction2 = static_cast<float>(sqrt(1.0 - pow(args.beta2, t)));
  c.eps = static_cast<float>(args.eps);
  c.neg_step_size = static_cast<float>(-lr / (1.0 - pow(args.beta1, t)));

  T* p = static_cast<T*>(table.ptr[k][0]) + begin;
  T* g = static_cast<T*>(table.ptr[k][1]) + begin;
  T* m = static_cast<T*>(table.ptr[k][2]) + begin;
  T* v = static_cast<T*>(table.ptr[k][3]) + begin;
  T* vmax = kAmsgrad ? static_cast<T*>(table.ptr[k][kLists - 1]) + begin : nullptr;

  int64_t scalar_from = 0;
  if (table.aligned[k]) {
    constexpr int kVec = 16 / sizeof(T);
    using V = Vec<T, kVec>;
    const int64_t num_vec = n / kVec;
    for (int64_t i = threadIdx.x; i < num_vec; i += kThreads) {
      V pv = reinterpret_cast<const V*>(p)[i];
      V gv = reinterpret_cast<const V*>(g)[i];
      V mv = reinterpret_cast<const V*>(m)[i];
      V vv = reinterpret_cast<const V*>(v)[i];
      V xv;
      if constexpr (kAmsgrad) xv = reinterpret_cast<const V*>(vmax)[i];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        float pf = static_cast<float>(pv.val[j]), gf = static_cast<float>(gv.val[j]);
        float mf = static_cast<float>(mv.val[j]), vf = static_cast<float>(vv.val[j]);
        float xf = 0.0f;
        if constexpr (kAmsgrad) xf = static_cast<float>(xv.val[j]);
        adam_element<kDecay, kAmsgrad>(pf, gf, mf, vf, xf, c);
        pv.val[j] = static_cast<T>(pf);
        gv.val[j] = static_cast<T>(gf);
        mv.val[j] = static_cast<T>(mf);
        vv.val[j] = static_cast<T>(vf);
        if constexpr (kAmsgrad) xv.val[j] = static_cast<T>(xf);
      }
      reinterpret_cast<V*>(p)[i] = pv;
      reinterpret_cast<V*>(m)[i] = mv;
      reinterpret_cast<V*>(v)[i] = vv;
      if constexpr (kAmsgrad) reinterpret_cast<V*>(vmax)[i] = xv;
      if (c.unscale) reinterpret_cast<V*>(g)[i] = gv;
    }
    scalar_from = num_vec * kVec;
  }
  for (int64_t i = scalar_from + threadIdx.x; i < n; i += kThreads) {
    float pf = static_cast<float>(p[i]), gf = static_cast<float>(g[i]);
    float mf = static_cast<float>(m[i]), vf = static_cast<float>(v[i]);
    float xf = 0.0f;
    if constexpr (kAmsgrad) xf = static_cast<float>(vmax[i]);
    adam_element<kDecay, kAmsgrad>(pf, gf, mf, vf, xf, c);
    p[i] = static_cast<T>(pf);
    m[i] = static_cast<T>(mf);
    v[i] = static_cast<T>(vf);
    if constexpr (kAmsgrad) vmax[i] = static_cast<T>(xf);
    if (c.unscale) g[i] = static_cast<T>(gf);
  }
}

// step += 1 for every tensor of the call (empty ones included), unless *found_inf != 0. Runs after
// the update kernels on the same stream, so they all read the step from before this call.
struct StepTable {
  static constexpr int kCapacity = static_cast<int>((kArgBytes - kArgReserve) / sizeof(float*));
  float* step[kCapacity];
  int32_t size;
};

__global__ void increment_steps_kernel(const FASTOPS_GRID_CONSTANT StepTable table, const float* found_inf) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  for (int i = threadIdx.x; i < table.size; i += blockDim.x) *table.step[i] += 1.0f;
}

inline bool is_aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename T, int kLists, Decay kDecay, bool kAmsgrad>
void launch_all(const adam::Work& w, const std::vector<size_t>& idx, const AdamArgs& args, cudaStream_t stream) {
  TensorTable<kLists> table;
  table.size = 0;
  int64_t blocks = 0;
  auto launch = [&] {
    if (table.size == 0) return;
    table.first_chunk[table.size] = static_cast<int32_t>(blocks);
    adam_kernel<T, kLists, kDecay, kAmsgrad><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table, args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    table.size = 0;
    blocks = 0;
  };
  for (size_t i : idx) {
    const int64_t numel = w.params[i].numel();
    if (numel == 0) continue;  // no chunk, and no effect on where the launch ends
    const int64_t chunks = (numel + kChunk - 1) / kChunk;
    // Blocks of one launch stay below 2^31 (the grid limit and the int32 prefix sums).
    if (table.size == TensorTable<kLists>::kCapacity || blocks + chunks > INT32_MAX) launch();
    TORCH_CHECK(chunks <= INT32_MAX, "fastops.fused_adam_: tensor too large");
    const int s = table.size;
    void* ptrs[5] = {w.params[i].data_ptr(), w.grads[i].data_ptr(), w.exp_avgs[i].data_ptr(),
                     w.exp_avg_sqs[i].data_ptr(), kAmsgrad ? w.max_exp_avg_sqs[i].data_ptr() : nullptr};
    bool aligned = true;
    for (int l = 0; l < kLists; ++l) {
      table.ptr[s][l] = ptrs[l];
      aligned = aligned && is_aligned16(ptrs[l]);
    }
    table.step[s] = w.steps[i].const_data_ptr<float>();
    table.numel[s] = numel;
    table.first_chunk[s] = static_cast<int32_t>(blocks);
    table.aligned[s] = aligned ? 1 : 0;
    table.size = s + 1;
    blocks += chunks;
  }
  launch();
}

template <typename T>
void launch_dtype(const adam::Work& w, const std::vector<size_t>& idx, const adam::Hyper& h, const AdamArgs& args,
                  cudaStream_t stream) {
  adam::dispatch_variant(h, [&](auto decay, auto amsgrad) {
    constexpr bool kAmsgrad = decltype(amsgrad)::value;
    launch_all<T, kAmsgrad ? 5 : 4, decltype(decay)::value, kAmsgrad>(w, idx, args, stream);
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

  std::map<at::ScalarType, std::vector<size_t>> by_dtype;
  for (size_t i = 0; i < w.params.size(); ++i) by_dtype[w.params[i].scalar_type()].push_back(i);
  // No structured binding: capturing one in a lambda is C++20, and builds against an older torch are
  // C++17 (nvcc warning #3357).
  for (const auto& entry : by_dtype) {
    const std::vector<size_t>& idx = entry.second;
    // fp32, fp16, bf16 only: prepare() rejected fp64 on CUDA.
    AT_DISPATCH_SWITCH(entry.first, "fastops_fused_adam_cuda", AT_DISPATCH_CASE(at::kFloat, [&] {
                         launch_dtype<scalar_t>(w, idx, h, args, stream);
                       }) AT_DISPATCH_CASE(at::kHalf, [&] {
                         launch_dtype<scalar_t>(w, idx, h, args, stream);
                       }) AT_DISPATCH_CASE(at::kBFloat16, [&] { launch_dtype<scalar_t>(w, idx, h, args, stream); }));
  }

  StepTable step_table;
  step_table.size = 0;
  auto launch_steps = [&] {
    if (step_table.size == 0) return;
    increment_steps_kernel<<<1, kThreads, 0, stream>>>(step_table, args.found_inf);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    step_table.size = 0;
  };
  for (const at::Tensor& s : w.steps) {
    if (step_table.size == StepTable::kCapacity) launch_steps();
    step_table.step[step_table.size++] = s.data_ptr<float>();
  }
  launch_steps();
  w.finish();
}

}  // namespace
}  // namespace fastops::cuda

TORCH_LIBRARY_IMPL(fastops, CUDA, m) { m.impl("fused_adam_", &fastops::cuda::fused_adam_); }
