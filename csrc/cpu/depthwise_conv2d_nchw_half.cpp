// depthwise_conv2d's NCHW fp16 / bf16 kernels through the fp32 paths (every ISA level; where they run:
// half_through_fp32 below, the kernels in depthwise_conv2d_nchw.cpp).
//
// The channel-blocked, register and wide-row paths are fp32 only, and a half-precision tensor left to
// the phase planes ran 1.5-6x slower than the fp32 one
// (git show 00da02d:benchmarks/results/depthwise_conv2d_cpu_nchw_half.md). Instead the planes
// go through them in chunks (a few images x a run of channels) widened into per-thread fp32 buffers
// of about L2/4, and the result is narrowed back: memory still carries only the fp16/bf16 tensors,
// and the conversions add ~2 instructions per element.
// Where it pays (thread-time A/B per pass, bf16, both ISAs): every strided pass (1.3-3.8x faster) and
// weight gradient, and stride-1 forward and input gradient on the register and channel-blocked paths'
// maps under 48 wide (1.3-2x). Stride-1 forward and input gradient on wider maps, and on the wide-row
// path at any width, stay with the phase planes, which widen each plane as they go: through fp32 the
// same 3x3 56x56 forward ran 20% (AVX-512) to 45% (AVX2) slower, a 7x7 one 10-30% slower.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "depthwise_conv2d_nchw.h"

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace nchw {
namespace {

struct PlaneChunks {
  int64_t N, C;              // the tensor's
  int64_t images, channels;  // a chunk's (at most)
  int64_t channel_chunks;
  int64_t count() const { return div_up(N, images) * channel_chunks; }
};

// Chunks of `images` images whose planes need floats_per_plane floats of buffer each: channels in
// multiples of 16 (the channel-blocked path's block) where more than 16 fit.
PlaneChunks plane_chunks(const DepthwiseGeometry& g, int64_t images, int64_t floats_per_plane) {
  constexpr int64_t kChunkFloats = 64 << 10;  // 256 KiB
  int64_t channels = std::max<int64_t>(1, kChunkFloats / (images * floats_per_plane));
  if (channels > 16) channels = channels / 16 * 16;
  channels = std::min(channels, g.C);
  return {g.N, g.C, images, channels, div_up(g.C, channels)};
}

// body(n0, images, c0, channels, in, out) on every chunk, with per-thread buffers of in_floats and
// out_floats: in parallel over chunks where there are enough of them, else one chunk at a time with
// the fp32 kernels' own threads (at::parallel_for runs inline inside a parallel region).
template <typename F>
void for_each_chunk(const PlaneChunks& ch, int64_t in_floats, int64_t out_floats, const F& body) {
  const auto run = [&](int64_t begin, int64_t end) {
    std::vector<float> in(in_floats), out(out_floats);
    for (int64_t k = begin; k < end; ++k) {
      const int64_t n0 = k / ch.channel_chunks * ch.images, c0 = k % ch.channel_chunks * ch.channels;
      body(n0, std::min(ch.images, ch.N - n0), c0, std::min(ch.channels, ch.C - c0), in.data(), out.data());
    }
  };
  if (ch.count() >= 2 * at::get_num_threads()) {
    at::parallel_for(0, ch.count(), 1, run);
  } else {
    run(0, ch.count());
  }
}

// The chunk's geometry: its images and channels as a tensor of their own.
DepthwiseGeometry chunk_geometry(const DepthwiseGeometry& g, int64_t images, int64_t channels) {
  DepthwiseGeometry c = g;
  c.N = images;
  c.C = channels;
  return c;
}

// dst (images, channels, plane) fp32 <- the chunk's planes of src (N, C, plane).
template <typename T>
void widen_chunk(float* dst, const T* src, int64_t C, int64_t plane, int64_t n0, int64_t images, int64_t c0,
                 int64_t channels) {
  for (int64_t n = 0; n < images; ++n) {
    convert_row<T, float>(dst + n * channels * plane, src + ((n0 + n) * C + c0) * plane, channels * plane);
  }
}

template <typename T>
void narrow_chunk(T* dst, const float* src, int64_t C, int64_t plane, int64_t n0, int64_t images, int64_t c0,
                  int64_t channels) {
  for (int64_t n = 0; n < images; ++n) {
    store_row<T, float>(dst + ((n0 + n) * C + c0) * plane, src + n * channels * plane, channels * plane);
  }
}
}  // namespace

bool half_through_fp32(FastPath path, const DepthwiseGeometry& g, Pass pass) {
  if (path == FastPath::kNone) return false;
  if (pass == Pass::kWeightGradient || g.sh > 1 || g.sw > 1) return true;
  return path != FastPath::kWide && g.W < 48;
}

// run_conv on fp16/bf16 tensors: in (N, C, in planes) and out (N, C, out planes), x and y for the
// forward, grad_output and dx for the input gradient.
template <typename T>
void half_conv(FastPath path, Pass pass, T* out, const T* in, const float* w, const float* bias,
               const DepthwiseGeometry& g) {
  const bool dgrad = pass == Pass::kInputGradient;
  const int64_t x_plane = g.H * g.W, y_plane = g.OH * g.OW, taps = g.taps();
  const int64_t in_plane = dgrad ? y_plane : x_plane, out_plane = dgrad ? x_plane : y_plane;
  const PlaneChunks ch = plane_chunks(g, 1, in_plane + out_plane);
  const int64_t planes = ch.images * ch.channels;
  for_each_chunk(ch, planes * in_plane, planes * out_plane,
                 [&](int64_t n0, int64_t images, int64_t c0, int64_t channels, float* in_buf, float* out_buf) {
                   widen_chunk(in_buf, in, g.C, in_plane, n0, images, c0, channels);
                   run_conv(path, pass, out_buf, in_buf, w + c0 * taps, bias ? bias + c0 : nullptr,
                            chunk_geometry(g, images, channels));
                   narrow_chunk(out, out_buf, g.C, out_plane, n0, images, c0, channels);
                 });
}

// ws (div_up(N, images_per_weight_row(path)), C, taps + 1). A chunk is one row's images, so it
// writes whole rows of its channels.
template <typename T>
void half_weight_sums(FastPath path, float* ws, const T* x, const T* go, const DepthwiseGeometry& g) {
  const int64_t in_plane = g.H * g.W, out_plane = g.OH * g.OW, slots = g.taps() + 1;
  const PlaneChunks ch = plane_chunks(g, images_per_weight_row(path), in_plane + out_plane);
  const int64_t planes = ch.images * ch.channels;
  for_each_chunk(ch, planes * (in_plane + out_plane), ch.channels * slots,
                 [&](int64_t n0, int64_t images, int64_t c0, int64_t channels, float* in, float* out) {
                   float* go_in = in + images * channels * in_plane;
                   widen_chunk(in, x, g.C, in_plane, n0, images, c0, channels);
                   widen_chunk(go_in, go, g.C, out_plane, n0, images, c0, channels);
                   run_weight_sums(path, out, in, go_in, chunk_geometry(g, images, channels));
                   std::copy(out, out + channels * slots, ws + (n0 / ch.images * g.C + c0) * slots);
                 });
}

template void half_conv<c10::Half>(FastPath, Pass, c10::Half*, const c10::Half*, const float*, const float*,
                                   const DepthwiseGeometry&);
template void half_conv<c10::BFloat16>(FastPath, Pass, c10::BFloat16*, const c10::BFloat16*, const float*, const float*,
                                       const DepthwiseGeometry&);
template void half_weight_sums<c10::Half>(FastPath, float*, const c10::Half*, const c10::Half*,
                                          const DepthwiseGeometry&);
template void half_weight_sums<c10::BFloat16>(FastPath, float*, const c10::BFloat16*, const c10::BFloat16*,
                                              const DepthwiseGeometry&);

}  // namespace nchw
}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
