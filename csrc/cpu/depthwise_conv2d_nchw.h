// What the NCHW depthwise kernels' files share (private to csrc/cpu/depthwise_conv2d_nchw*.cpp): the
// passes, the specialised fp32 paths and each path's entry points, which take the plane geometry and
// raw pointers; each path's plans and intrinsics stay in its own file.
//   depthwise_conv2d_nchw.cpp           the phase planes, the choice of path, the kernels
//   depthwise_conv2d_nchw_blocked.cpp   channel-blocked small maps (fp32, every ISA)
//   depthwise_conv2d_nchw_register.cpp  small planes in registers (fp32, AVX-512)
//   depthwise_conv2d_nchw_wide.cpp      rows over 16 wide (fp32, AVX-512 and AVX2)
//   depthwise_conv2d_nchw_half.cpp      fp16 / bf16 through the fp32 paths
// The fp32 paths read and write (N, C, plane) fp32 tensors, weights (C, taps), bias (C) or nullptr.
#pragma once

#include <c10/macros/Macros.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace nchw {

// The three passes, for the choice of path.
enum class Pass { kForward, kInputGradient, kWeightGradient };

// Which of the fp32 paths runs a pass (kNone: the phase planes), chosen from the plane geometry
// alone (never N or C), so that a chunk of a tensor's planes takes the path the whole tensor would.
enum class FastPath { kNone, kRegister, kWide, kBlocked };

// ---- the choice of path (depthwise_conv2d_nchw.cpp) ----------------------------------------------
// The first path that applies: the register path, the wide rows, the channel-blocked path.
FastPath fast_path(const DepthwiseGeometry& g, Pass pass);

// The forward (out y, in x) or the input gradient (out dx, in grad_output, bias nullptr) on a path.
void run_conv(FastPath path, Pass pass, float* out, const float* in, const float* w, const float* bias,
              const DepthwiseGeometry& g);

// Images per row of partial sums (each row C x (taps + 1)) that run_weight_sums writes: the register
// path sums kWgradImages images a row, the others one.
int64_t images_per_weight_row(FastPath path);

// ws (div_up(N, images_per_weight_row(path)), C, taps + 1): per row and channel each tap's sum of
// grad_output * x, then the sum of grad_output.
void run_weight_sums(FastPath path, float* ws, const float* x, const float* go, const DepthwiseGeometry& g);

// ---- channel-blocked small maps (depthwise_conv2d_nchw_blocked.cpp) ------------------------------
// Where the blocked path runs the pass (the register and wide-row paths, where they apply, go first).
bool use_blocked(const DepthwiseGeometry& g, Pass pass);
// The forward (dgrad false) or the input gradient (dgrad true, bias nullptr).
void blocked_conv(float* out, const float* in, const float* w, const float* bias, const DepthwiseGeometry& g,
                  bool dgrad);
// ws (N, C, taps + 1).
void blocked_wgrad(float* ws, const float* x, const float* go, const DepthwiseGeometry& g);

// ---- shared by the register and wide-row paths --------------------------------------------------
// a / b rounded down (b > 0).
inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// The forward's (and the weight gradient's) tap offsets into x, or the input gradient's into
// grad_output: output (i, j) reads source (i + c, j + e) at stride 1.
inline std::vector<std::pair<int64_t, int64_t>> tap_offsets(const DepthwiseGeometry& g, bool dgrad) {
  std::vector<std::pair<int64_t, int64_t>> offsets;
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const int64_t c = kh * g.dh - g.pt, e = kw * g.dw - g.pl;
      offsets.emplace_back(dgrad ? -c : c, dgrad ? -e : e);
    }
  }
  return offsets;
}

#if defined(CPU_CAPABILITY_AVX512)
// v into the `lanes` of out: a plain store where that is all 16 (see store_lanes: masked stores, even
// of all 16 lanes, stream at about half the rate of plain ones on Zen 5).
C10_ALWAYS_INLINE void store_vector(float* out, __mmask16 lanes, __m512 v) {
  if (lanes == 0xFFFF) {
    _mm512_storeu_ps(out, v);
  } else {
    _mm512_mask_storeu_ps(out, lanes, v);
  }
}

// The 16 vectors' lane sums in one vector, by a transposing tree (45 instructions against ~8 per
// vector reduced alone); lane l holds the sum of v[reduced_lane_source()[l]].
inline __m512 reduce16(const __m512 (&v)[16]) {
  __m512 s8[8], s4[4], s2[2];
  static_for_inlined<8>([&](auto i) {
    const __m512 a = v[2 * i], b = v[2 * i + 1];
    s8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  });
  static_for_inlined<4>([&](auto i) {
    const __m512 a = s8[2 * i], b = s8[2 * i + 1];
    s4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
  });
  static_for_inlined<2>([&](auto i) {
    const __m512 a = s4[2 * i], b = s4[2 * i + 1];
    s2[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xEE));
  });
  return _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], 0x88), _mm512_shuffle_ps(s2[0], s2[1], 0xDD));
}

// Which input vector each lane of reduce16's result sums (found once by reducing v[i] = i).
inline const std::array<int32_t, 16>& reduced_lane_source() {
  static const std::array<int32_t, 16> source = [] {
    __m512 v[16];
    for (int i = 0; i < 16; ++i) v[i] = _mm512_set1_ps(static_cast<float>(i));
    alignas(64) float r[16];
    _mm512_store_ps(r, reduce16(v));
    std::array<int32_t, 16> s{};
    for (int l = 0; l < 16; ++l) s[l] = static_cast<int32_t>(r[l] / 16.f);
    return s;
  }();
  return source;
}

// out[0, count) = the lane sums of acc[0, count), 16 vectors reduced at a time (acc holds count
// rounded up to 16 vectors).
inline void store_lane_sums(float* out, const __m512* acc, int64_t count) {
  const std::array<int32_t, 16>& source = reduced_lane_source();
  for (int64_t s0 = 0; s0 < count; s0 += 16) {
    alignas(64) float r[16];
    _mm512_store_ps(r, reduce16(*reinterpret_cast<const __m512(*)[16]>(acc + s0)));
    for (int l = 0; l < 16; ++l) {
      if (s0 + source[l] < count) out[s0 + source[l]] = r[l];
    }
  }
}
#endif

#if defined(CPU_CAPABILITY_AVX512)
// ---- small planes in registers (depthwise_conv2d_nchw_register.cpp) -----------------------------
// Images per weight-gradient partial: each (block of images, channel) accumulates its planes lane-wise
// and reduces once, so the reduction of the tap sums (a 16-vector tree and a scatter, more than a 4x4
// plane's FMAs) is paid once per 8 planes. The blocks depend on N alone: bitwise repeatable.
constexpr int64_t kWgradImages = 8;

// Where the register path applies (the input gradient's at stride 1 only: fast_path).
bool use_register_plane(const DepthwiseGeometry& g, bool weight_gradient);
// The forward (dgrad false) or the stride-1 input gradient (dgrad true, bias nullptr).
void register_conv(float* out, const float* in, const float* w, const float* bias, const DepthwiseGeometry& g,
                   bool dgrad);
// ws (ceil(N / kWgradImages), C, taps + 1).
void register_wgrad(float* ws, const float* x, const float* go, const DepthwiseGeometry& g);
#endif

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// ---- rows over 16 wide (depthwise_conv2d_nchw_wide.cpp) -----------------------------------------
// Where the wide-row path runs the pass.
bool use_wide_rows(const DepthwiseGeometry& g, Pass pass);
void wide_forward(float* y, const float* x, const float* w, const float* bias, const DepthwiseGeometry& g);
void wide_input_gradient(float* dx, const float* go, const float* w, const DepthwiseGeometry& g);
// ws (N, C, taps + 1).
void wide_weight_sums(float* ws, const float* x, const float* go, const DepthwiseGeometry& g);
#endif

// ---- fp16 / bf16 through the fp32 paths (depthwise_conv2d_nchw_half.cpp) -------------------------
// Whether a half-precision pass takes `path` through fp32 chunks rather than the phase planes.
bool half_through_fp32(FastPath path, const DepthwiseGeometry& g, Pass pass);
// run_conv and run_weight_sums on fp16 / bf16 tensors (T: c10::Half or c10::BFloat16, instantiated there).
template <typename T>
void half_conv(FastPath path, Pass pass, T* out, const T* in, const float* w, const float* bias,
               const DepthwiseGeometry& g);
template <typename T>
void half_weight_sums(FastPath path, float* ws, const T* x, const T* go, const DepthwiseGeometry& g);

}  // namespace nchw
}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
