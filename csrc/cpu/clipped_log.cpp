// clipped_log on the CPU.
//   forward:  y = log(max(x, eps))
//   backward: straight_through: dx = g / max(x, eps)
//             otherwise:        dx = x >= eps ? g / max(x, eps) : 0   (autograd of log(clamp(x, eps)))
// max() propagates NaN, as clamp does. Layout: any tensor walked flat (see densify in checks.h).
// Strategy: at::vec over Vectorized<float> (fp16/bf16 widened), at::parallel_for over flat chunks.
// Bytes per element: forward 2*sizeof(T), backward 3*sizeof(T).
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>
#include <fastops/checks.h>
#include <fastops/cpu_loops.h>
#include <torch/library.h>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
at::Tensor clipped_log(const at::Tensor& x_in, double eps, bool /*straight_through*/) {
  check_floating("clipped_log", "x", x_in);
  check_positive_fits_compute_type("clipped_log", "eps", eps, x_in);
  const at::Tensor x = densify(x_in);
  at::Tensor y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_clipped_log_cpu", [&] {
    using Vec = at::vec::Vectorized<opmath_t<scalar_t>>;
    const Vec eps_vec(static_cast<opmath_t<scalar_t>>(eps));
    elementwise<scalar_t, 1>(y.data_ptr<scalar_t>(), x.numel(),
                             [&](const Vec& v) { return at::vec::maximum(v, eps_vec).log(); },
                             {x.const_data_ptr<scalar_t>()});
  });
  return y;
}

at::Tensor clipped_log_backward(const at::Tensor& grad_in, const at::Tensor& x_in, double eps, bool straight_through) {
  check_floating("clipped_log_backward", "x", x_in);
  check_same_dtype("clipped_log_backward", "grad_out", grad_in, "x", x_in);
  check_same_shape("clipped_log_backward", "grad_out", grad_in, "x", x_in);
  check_positive_fits_compute_type("clipped_log_backward", "eps", eps, x_in);
  const at::Tensor x = densify(x_in);
  const at::Tensor grad = match_layout(grad_in, x);
  at::Tensor dx = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fastops_clipped_log_backward_cpu", [&] {
    using Vec = at::vec::Vectorized<opmath_t<scalar_t>>;
    const Vec eps_vec(static_cast<opmath_t<scalar_t>>(eps));
    const Vec zero(0);
    const std::array<const scalar_t*, 2> in = {grad.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>()};
    if (straight_through) {
      elementwise<scalar_t, 2>(
          dx.data_ptr<scalar_t>(), x.numel(),
          [&](const Vec& g, const Vec& v) { return g / at::vec::maximum(v, eps_vec); }, in);
    } else {
      elementwise<scalar_t, 2>(
          dx.data_ptr<scalar_t>(), x.numel(),
          [&](const Vec& g, const Vec& v) {
            // x >= eps is false for NaN, so NaN inputs get a zero gradient, as clamp's backward gives.
            return Vec::blendv(zero, g / at::vec::maximum(v, eps_vec), v >= eps_vec);
          },
          in);
    }
  });
  return dx;
}

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
