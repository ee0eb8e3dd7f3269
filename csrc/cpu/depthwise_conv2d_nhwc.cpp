// depthwise_conv2d's NHWC (channels_last) kernels on the CPU (the math: cpu/depthwise_conv2d.cpp).
//
// Forward: one output row (n, oh) per task (NhwcForwardRow, also the depthwise half of the fused
// depthwise_separable_conv2d). 3/5/7-wide kernels at stride 1 run every pixel of the row in register
// row blocks, the border blocks reading their padding columns from a row of zeros (with finite
// weights only: see all_finite). Otherwise per border pixel the
// list of in-bounds taps is built once, then the channel loop runs over it with 4 vectors of
// channels per step (weights pre-transposed to [tap][C]), and interior pixels go in row blocks (3/5/7
// wide, stride 2) or blocks of 4 pixels. 5/7-wide kernels at stride 2 whose zero-padded image fits
// in 1 MiB run one image per task from a zero-padded copy, all in row blocks (forward_padded_images):
// on small maps most pixels are border pixels, on wide ones few-channel border pixels are slow.
// The input gradient is the same gather seen from the input side (taps whose stride phase
// matches), one input row per task. The weight gradient splits the N*OH output rows into a fixed
// number of fixed-size items (a function of the shape only, never of the thread count); each item
// writes its partial [tap][C] sums to a workspace slot, which the caller adds in item order:
// deterministic and bitwise repeatable, no atomics, one pass over x and grad_output from memory.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/empty.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>
#include <fastops/depthwise_cpu.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace fastops::cpu {
inline namespace CPU_CAPABILITY {
namespace {

// ---- register blocks of the forward and the input gradient ---------------------------------------

// out[c] = init[c] + sum_t w[tap[t]][c] * base[off[t] + c] for c in [0, C); w is [taps][Cp] in A.
template <typename T>
inline void nhwc_pixel(T* out, const T* base, const int64_t* off, const int64_t* tap, int64_t nt, const opmath_t<T>* w,
                       int64_t Cp, const opmath_t<T>* init, int64_t C) {
  using A = opmath_t<T>;
  using V = at::vec::Vectorized<A>;
  constexpr int64_t L = V::size();
  int64_t c = 0;
  for (; c + 4 * L <= C; c += 4 * L) {
    V a0(A(0)), a1(A(0)), a2(A(0)), a3(A(0));
    if (init) {
      a0 = V::loadu(init + c);
      a1 = V::loadu(init + c + L);
      a2 = V::loadu(init + c + 2 * L);
      a3 = V::loadu(init + c + 3 * L);
    }
    for (int64_t t = 0; t < nt; ++t) {
      const T* s = base + off[t] + c;
      const A* wt = w + tap[t] * Cp + c;
      a0 = at::vec::fmadd(load_opmath<T>(s), V::loadu(wt), a0);
      a1 = at::vec::fmadd(load_opmath<T>(s + L), V::loadu(wt + L), a1);
      a2 = at::vec::fmadd(load_opmath<T>(s + 2 * L), V::loadu(wt + 2 * L), a2);
      a3 = at::vec::fmadd(load_opmath<T>(s + 3 * L), V::loadu(wt + 3 * L), a3);
    }
    store_opmath<T>(out + c, a0, L);
    store_opmath<T>(out + c + L, a1, L);
    store_opmath<T>(out + c + 2 * L, a2, L);
    store_opmath<T>(out + c + 3 * L, a3, L);
  }
  for (; c < C; c += L) {
    const int64_t cnt = std::min(L, C - c);
    V a = init ? V::loadu(init + c) : V(A(0));  // init and w are padded to Cp
    if (cnt == L) {
      for (int64_t t = 0; t < nt; ++t)
        a = at::vec::fmadd(load_opmath<T>(base + off[t] + c), V::loadu(w + tap[t] * Cp + c), a);
    } else {
      for (int64_t t = 0; t < nt; ++t) {
        a = at::vec::fmadd(load_opmath<T>(base + off[t] + c, cnt), V::loadu(w + tap[t] * Cp + c), a);
      }
    }
    store_opmath<T>(out + c, a, cnt);
  }
}

// Four neighbouring output pixels at once, all of whose taps are in bounds: out pixel j (at
// out + j * out_step) = init + sum_t w[t] * src[t][j * src_step + c]. One channel vector per step,
// so each weight vector is loaded once for four independent FMA chains.
template <typename T>
inline void nhwc_block4(T* out, int64_t out_step, const T* const* src, int64_t src_step, int64_t nt,
                        const opmath_t<T>* w, int64_t Cp, const opmath_t<T>* init, int64_t C) {
  using A = opmath_t<T>;
  using V = at::vec::Vectorized<A>;
  constexpr int64_t L = V::size();
  for (int64_t c = 0; c < C; c += L) {
    const int64_t cnt = std::min(L, C - c);
    const V i0 = init ? V::loadu(init + c) : V(A(0));
    V a0 = i0, a1 = i0, a2 = i0, a3 = i0;
    if (cnt == L) {
      for (int64_t t = 0; t < nt; ++t) {
        const V wv = V::loadu(w + t * Cp + c);
        const T* s = src[t] + c;
        a0 = at::vec::fmadd(load_opmath<T>(s), wv, a0);
        a1 = at::vec::fmadd(load_opmath<T>(s + src_step), wv, a1);
        a2 = at::vec::fmadd(load_opmath<T>(s + 2 * src_step), wv, a2);
        a3 = at::vec::fmadd(load_opmath<T>(s + 3 * src_step), wv, a3);
      }
    } else {
      for (int64_t t = 0; t < nt; ++t) {
        const V wv = V::loadu(w + t * Cp + c);
        const T* s = src[t] + c;
        a0 = at::vec::fmadd(load_opmath<T>(s, cnt), wv, a0);
        a1 = at::vec::fmadd(load_opmath<T>(s + src_step, cnt), wv, a1);
        a2 = at::vec::fmadd(load_opmath<T>(s + 2 * src_step, cnt), wv, a2);
        a3 = at::vec::fmadd(load_opmath<T>(s + 3 * src_step, cnt), wv, a3);
      }
    }
    store_opmath<T>(out + c, a0, cnt);
    store_opmath<T>(out + out_step + c, a1, cnt);
    store_opmath<T>(out + 2 * out_step + c, a2, cnt);
    store_opmath<T>(out + 3 * out_step + c, a3, cnt);
  }
}

// Whether every weight is finite. The zero-padded paths add 0 * w for a padding tap, which is NaN
// for an inf or NaN weight, where PyTorch's fp32 depthwise convolution skips the tap: with such a
// weight the forward takes the paths that skip padding taps too.
template <typename A>
bool all_finite(const A* w, int64_t n) {
  bool finite = true;
  for (int64_t i = 0; i < n; ++i) finite &= std::isfinite(w[i]);
  return finite;
}

// Where a row block reads input column u of its input row r. Inside the image the columns follow each
// other: rows[r] + u * C. At a border the block lists every column, those in the padding pointing at
// a row of zeros, so that border pixels run the same register block as interior ones.
// kPrefetch: at stride 1, request each column kColumnPrefetchBytes ahead of the channel vector read.
// A block reads S*(P-1)+K columns of every row, C elements apart, a vector at a time: more streams
// than the hardware prefetchers follow. Measured (interleaved A/B, 1 thread): 11-16% off the
// per-row forward on 14x14-28x28 maps; slower at stride 2 (5% on 112x112), in the padded-image
// forward (9-12% on ConvNeXt's 7x7 kernels), in the input gradient and with narrow pixels (see
// NhwcForwardRow::run), so those read without.
constexpr int64_t kColumnPrefetchBytes = 256;
template <typename T, bool kPrefetchColumns>
struct StridedColumns {
  static constexpr bool kPrefetch = kPrefetchColumns, kListed = false;
  const T* const* rows;  // column u of row r: rows[r] + u * C
};
template <typename T, bool kPrefetchColumns>
struct ListedColumns {
  static constexpr bool kPrefetch = kPrefetchColumns, kListed = true;
  const T* const* cols;  // column u of row r: cols[r * per_row + u]
  int64_t per_row;
};

// P neighbouring output pixels of one row for a K-wide kernel at column stride S and column
// dilation 1: out[j] = init + sum_r sum_kw w_r[kw] * x_r[j*S + kw]. Each input vector x_r[u] is
// loaded once and feeds every (j, kw) with j*S + kw == u, so a row of K taps costs S*(P-1) + K loads
// for P*K FMAs (the 4-pixel block above loads P*K). cols gives input column u of row r, column
// 0 under pixel 0's first tap; wrows[r] points at that row's K weight vectors ([K][Cp]). kStream: fp32
// whole vectors go out in streaming stores (out and C whole vectors, see streaming_stores_pay); a
// template parameter, since a runtime flag made GCC's code for the plain stores 4-6% slower
// (ConvNeXt-atto's 40-channel 7x7 forward).
template <typename T, int K, int S, int P, bool Full, bool kStream, typename Cols>
inline void nhwc_row_block_c(T* out, int64_t C, const Cols& cols, const opmath_t<T>* const* wrows, int64_t nrows,
                             int64_t Cp, const opmath_t<T>* init, int64_t c, int64_t cnt) {
  using A = opmath_t<T>;
  using V = at::vec::Vectorized<A>;
  constexpr int U = S * (P - 1) + K;
  // Every index below is a compile-time constant (static_for), so acc and wv live in registers.
  V acc[P];
  const V i0 = init ? V::loadu(init + c) : V(A(0));
  static_for<P>([&](auto j) { acc[j] = i0; });
  for (int64_t r = 0; r < nrows; ++r) {
    V wv[K];
    static_for<K>([&](auto kw) { wv[kw] = V::loadu(wrows[r] + kw * Cp + c); });
    // The strided form as base + u * C from one row pointer: computing each column's offset apart
    // made GCC keep nine offsets, spill three, and run the AVX2 stride-2 block 1.3x slower.
    const T* xr = nullptr;
    const T* const* xcols = nullptr;
    if constexpr (Cols::kListed) {
      xcols = cols.cols + r * cols.per_row;
    } else {
      xr = cols.rows[r] + c;
    }
    static_for<U>([&](auto u) {
      const T* xu;
      if constexpr (Cols::kListed) {
        xu = xcols[decltype(u)::value] + c;
      } else {
        xu = xr + decltype(u)::value * C;
      }
      if constexpr (Cols::kPrefetch && S == 1) {
        __builtin_prefetch(reinterpret_cast<const char*>(xu) + kColumnPrefetchBytes);
      }
      const V xv = Full ? load_opmath<T>(xu) : load_opmath<T>(xu, cnt);
      static_for<K>([&](auto kw) {
        constexpr int d = decltype(u)::value - decltype(kw)::value;
        if constexpr (d >= 0 && d % S == 0 && d / S < P) acc[d / S] = at::vec::fmadd(xv, wv[kw], acc[d / S]);
      });
    });
  }
  if constexpr (kStream && Full) {
    static_for<P>([&](auto j) { stream_store(out + j * C + c, acc[j]); });
  } else {
    static_for<P>([&](auto j) { store_opmath<T>(out + j * C + c, acc[j], cnt); });
  }
}

template <typename T, int K, int S, int P, bool kStream, typename Cols>
inline void nhwc_row_block(T* out, int64_t C, const Cols& cols, const opmath_t<T>* const* wrows, int64_t nrows,
                           int64_t Cp, const opmath_t<T>* init) {
  constexpr int64_t L = at::vec::Vectorized<opmath_t<T>>::size();
  int64_t c = 0;
  for (; c + L <= C; c += L) nhwc_row_block_c<T, K, S, P, true, kStream>(out, C, cols, wrows, nrows, Cp, init, c, L);
  if (c < C) nhwc_row_block_c<T, K, S, P, false, kStream>(out, C, cols, wrows, nrows, Cp, init, c, C - c);
}

// Pixels per register block: 8 at stride 1, 4 at stride 2 (so 16 vector registers suffice).
template <int S>
constexpr int64_t row_block_pixels() {
  return S == 1 ? 8 : 4;
}

// Pixels per block when a whole stride-1 row of n (>= 4) pixels runs in row blocks: blocks that tile
// the row exactly, 8 or else 7 pixels wide (7x7, 14x14 and 28x28 maps), else 8 with a remainder
// block (or 4 for rows of 4-6). Blocks of 7 on 7-pixel rows instead of two overlapping blocks of 4:
// forward and input gradient 25-30% faster on AVX-512 (7x7 maps, 3x3 and 7x7 kernels), 15-35% on AVX2.
inline int64_t listed_block_pixels(int64_t n) {
  if (n % 8 == 0) return 8;
  if (n % 7 == 0) return 7;
  return n >= 8 ? 8 : 4;
}

// Covers pixels [begin, end) (at least P of them) with row blocks of P pixels (8, 7 or 4): f(first
// pixel, pixels). A remainder of 1-4 pixels takes a block of 4, a longer one a block of P, each ending
// at end and overlapping the block before it (both write the same values there).
template <typename F>
inline void for_each_row_block(int64_t begin, int64_t end, int64_t P, const F& f) {
  int64_t o = begin;
  for (; o + P <= end; o += P) f(o, P);
  if (o < end) {
    const int64_t q = end - o <= 4 ? 4 : P;
    f(end - q, q);
  }
}

// Runs nhwc_row_block for a runtime (K, S, P) in {3, 5, 7} x {(1, 8), (1, 7), (1, 4), (2, 4)}; false
// when there is no variant. At stride 1, P = 7 tiles rows of 7, 14, 21 ... pixels (listed_block_pixels)
// and P = 4 takes short rows and remainders.
template <typename T, typename Cols>
bool dispatch_row_block(int64_t K, int64_t S, int64_t P, T* out, int64_t C, const Cols& cols,
                        const opmath_t<T>* const* wrows, int64_t nrows, int64_t Cp, const opmath_t<T>* init,
                        bool stream = false) {
// Streaming stores only for fp32 (stream_output), so other types instantiate the plain-store block only.
#define FASTOPS_ROW_BLOCK(KK, SS, PP)                                              \
  if (K == KK && S == SS && P == PP) {                                             \
    if constexpr (std::is_same_v<T, float>) {                                      \
      if (stream) {                                                                \
        nhwc_row_block<T, KK, SS, PP, true>(out, C, cols, wrows, nrows, Cp, init); \
        return true;                                                               \
      }                                                                            \
    }                                                                              \
    nhwc_row_block<T, KK, SS, PP, false>(out, C, cols, wrows, nrows, Cp, init);    \
    return true;                                                                   \
  }
// The (S, P) variants of one kernel width: stride 1 in blocks of 8, 7 and 4, stride 2 in blocks of 4.
#define FASTOPS_ROW_BLOCKS(KK) \
  FASTOPS_ROW_BLOCK(KK, 1, 8)  \
  FASTOPS_ROW_BLOCK(KK, 1, 7)  \
  FASTOPS_ROW_BLOCK(KK, 1, 4)  \
  FASTOPS_ROW_BLOCK(KK, 2, 4)
  FASTOPS_ROW_BLOCKS(3)
  FASTOPS_ROW_BLOCKS(5)
  FASTOPS_ROW_BLOCKS(7)
#undef FASTOPS_ROW_BLOCKS
#undef FASTOPS_ROW_BLOCK
  return false;
}

inline bool has_row_block(int64_t K, int64_t S, int64_t D) {
  return D == 1 && (K == 3 || K == 5 || K == 7) && (S == 1 || S == 2);
}
// ---- input gradient ------------------------------------------------------------------------------

// The weights with each kernel row mirrored along w, [taps][Cp]: the stride-1 input gradient is the
// forward's row block on grad_output with this kernel.
template <typename A>
std::vector<A> mirrored_weights(const A* wp, const DepthwiseGeometry& g, int64_t Cp) {
  std::vector<A> wflip(g.taps() * Cp);
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      std::memcpy(wflip.data() + (kh * g.KW + kw) * Cp, wp + (kh * g.KW + g.KW - 1 - kw) * Cp, sizeof(A) * Cp);
    }
  }
  return wflip;
}

// One input row (n, ih) of the NHWC input gradient: dx[iw] = sum over the taps whose window puts
// (ih, iw) on an output pixel of w[tap] * g[that pixel]. Border pixels tap by tap; at stride 1 the
// interior pixels (every kw on an output column) in register blocks; at other strides the input
// columns of one stride phase in blocks of 4. Holds per-thread scratch: make one per task.
template <typename T>
class NhwcInputGradRow {
 public:
  using A = opmath_t<T>;
  // wt: the (taps, Cp) transposed weights; wflip: mirrored_weights(wt) when has_row_block(KW, 1, dw)
  // at stride 1, else unused. stream: the row blocks write in streaming stores (stream_output).
  NhwcInputGradRow(const DepthwiseGeometry& g, const A* wt, const A* wflip, int64_t Cp, bool stream)
      : g_(g), wp_(wt), wflip_(wflip), Cp_(Cp), stream_(stream), scratch_(g) {
    // Stride 1: interior input columns have every kw on an output column, iw + pl - kw*dw in
    // [0, OW) for all kw: iw >= (KW-1)*dw - pl and iw + pl <= OW - 1.
    unit_ = g.sw == 1;
    few_ = g.KH <= 64 && g.KW <= 64;
    iw_lo_ = unit_ ? std::min(g.W, std::max<int64_t>(0, (g.KW - 1) * g.dw - g.pl)) : g.W;
    iw_hi_ = unit_ ? std::max(iw_lo_, std::min(g.W, g.OW - g.pl)) : g.W;
    row_block_ = unit_ && has_row_block(g.KW, 1, g.dw);
    // As the forward: every pixel of the row in row blocks, the grad_output columns outside the
    // output read from a row of zeros (finite weights only, see all_finite).
    if (row_block_ && few_ && all_finite(wt, g.taps() * Cp)) border_.enable(listed_block_pixels(g.W), g.C, g.KH, g.KW);
  }

  // dxrow: input row ih of image n; gb: image n of grad_output.
  void run(T* dxrow, const T* gb, int64_t ih) {
    if (!unit_ && few_) {
      strided_row(dxrow, gb, ih);
      return;
    }
    if (border_.pixels > 0 && g_.W >= border_.pixels) {
      listed_row(dxrow, gb, ih);
      return;
    }
    int64_t iw = 0;
    if (unit_ && few_ && iw_hi_ - iw_lo_ >= 4) iw = unit_stride_blocks(dxrow, gb, ih);
    for (; iw < g_.W; ++iw) pixel(dxrow, gb, ih, iw);
  }

 private:
  void pixel(T* dxrow, const T* gb, int64_t ih, int64_t iw) {
    const DepthwiseGeometry& g = g_;
    int64_t nt = 0;
    for (int64_t kh = 0; kh < g.KH; ++kh) {
      const int64_t th = ih + g.pt - kh * g.dh;
      if (th < 0 || th % g.sh != 0 || th / g.sh >= g.OH) continue;
      const int64_t oh = th / g.sh;
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        const int64_t tw = iw + g.pl - kw * g.dw;
        if (tw < 0 || tw % g.sw != 0 || tw / g.sw >= g.OW) continue;
        scratch_.off[nt] = (oh * g.OW + tw / g.sw) * g.C;
        scratch_.tap[nt++] = kh * g.KW + kw;
      }
    }
    nhwc_pixel<T>(dxrow + iw * g.C, gb, scratch_.off.data(), scratch_.tap.data(), nt, wp_, Cp_, nullptr, g.C);
  }

  // The kh whose window puts row ih on an output row, (ih + pt - kh*dh) a multiple of sh in
  // [0, sh*OH), into khs_; returns how many.
  int64_t rows_on_output(int64_t ih) {
    const DepthwiseGeometry& g = g_;
    int64_t nkh = 0;
    for (int64_t kh = 0; kh < g.KH; ++kh) {
      const int64_t th = ih + g.pt - kh * g.dh;
      if (th < 0 || th % g.sh != 0 || th / g.sh >= g.OH) continue;
      khs_[nkh++] = kh;
    }
    return nkh;
  }

  // Stride 1: the left border pixels, then the interior in row blocks and blocks of 4; returns the
  // first pixel left for the caller.
  int64_t unit_stride_blocks(T* dxrow, const T* gb, int64_t ih) {
    const DepthwiseGeometry& g = g_;
    const int64_t nkh = rows_on_output(ih);
    // Weights of the valid (kh, all kw) taps, gathered once per row in block order.
    wsel_.resize(std::max<int64_t>(1, nkh * g.KW) * Cp_);
    for (int64_t i = 0; i < nkh; ++i) {
      std::memcpy(wsel_.data() + i * g.KW * Cp_, wp_ + khs_[i] * g.KW * Cp_, sizeof(A) * g.KW * Cp_);
    }
    int64_t iw = 0;
    for (; iw < iw_lo_; ++iw) pixel(dxrow, gb, ih, iw);
    if (row_block_) {
      // dx[iw] = sum_kw w[kw] g[iw + pl - kw] = sum_kw' wflip[kw'] g[iw + pl - (KW-1) + kw']:
      // the forward's row block on g with the kernel mirrored along w.
      constexpr int64_t P = row_block_pixels<1>();
      for (int64_t i = 0; i < nkh; ++i) scratch_.wrow_ptr[i] = wflip_ + khs_[i] * g.KW * Cp_;
      for (; iw + P <= iw_hi_; iw += P) {
        for (int64_t i = 0; i < nkh; ++i) {
          const int64_t oh = (ih + g.pt - khs_[i] * g.dh) / g.sh;
          scratch_.row_ptr[i] = gb + (oh * g.OW + iw + g.pl - (g.KW - 1)) * g.C;
        }
        dispatch_row_block<T>(g.KW, 1, P, dxrow + iw * g.C, g.C, StridedColumns<T, false>{scratch_.row_ptr.data()},
                              scratch_.wrow_ptr.data(), nkh, Cp_, nullptr, stream_);
      }
    }
    for (; iw + 4 <= iw_hi_; iw += 4) {
      int64_t t = 0;
      for (int64_t i = 0; i < nkh; ++i) {
        const T* grow = gb + ((ih + g.pt - khs_[i] * g.dh) / g.sh) * g.OW * g.C;
        for (int64_t kw = 0; kw < g.KW; ++kw) scratch_.src[t++] = grow + (iw + g.pl - kw * g.dw) * g.C;
      }
      nhwc_block4<T>(dxrow + iw * g.C, g.C, scratch_.src.data(), g.C, nkh * g.KW, wsel_.data(), Cp_, nullptr, g.C);
    }
    return iw;
  }

  // Stride 1, the whole row in row blocks: dx[iw] = sum_kw' wflip[kw'] g[iw + pl - (KW-1) + kw'] (see
  // unit_stride_blocks), so column u of a block at o is output column o + pl - (KW-1) + u.
  void listed_row(T* dxrow, const T* gb, int64_t ih) {
    const DepthwiseGeometry& g = g_;
    const int64_t nkh = rows_on_output(ih);
    for (int64_t i = 0; i < nkh; ++i) scratch_.wrow_ptr[i] = wflip_ + khs_[i] * g.KW * Cp_;
    for_each_row_block(0, g.W, border_.pixels, [&](int64_t o, int64_t P) {
      const int64_t U = P - 1 + g.KW;
      const int64_t ow0 = o + g.pl - (g.KW - 1);
      if (o >= iw_lo_ && o + P <= iw_hi_) {
        for (int64_t i = 0; i < nkh; ++i) {
          scratch_.row_ptr[i] = gb + (((ih + g.pt - khs_[i] * g.dh) / g.sh) * g.OW + ow0) * g.C;
        }
        dispatch_row_block<T>(g.KW, 1, P, dxrow + o * g.C, g.C, StridedColumns<T, false>{scratch_.row_ptr.data()},
                              scratch_.wrow_ptr.data(), nkh, Cp_, nullptr, stream_);
        return;
      }
      const T* const* cols = border_.list(
          nkh, U, ow0, g.OW, g.C, [&](int64_t i) { return gb + ((ih + g.pt - khs_[i] * g.dh) / g.sh) * g.OW * g.C; });
      dispatch_row_block<T>(g.KW, 1, P, dxrow + o * g.C, g.C, ListedColumns<T, false>{cols, U},
                            scratch_.wrow_ptr.data(), nkh, Cp_, nullptr, stream_);
    });
  }

  // Strided: the input columns of one stride phase (iw = ph + sw*m) see the same kw taps, and
  // consecutive m read consecutive output columns, so four of them form one block.
  void strided_row(T* dxrow, const T* gb, int64_t ih) {
    const DepthwiseGeometry& g = g_;
    const int64_t nkh = rows_on_output(ih);
    for (int64_t ph = 0; ph < g.sw && ph < g.W; ++ph) {
      int64_t nkw = 0;
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        if (((ph + g.pl - kw * g.dw) % g.sw + g.sw) % g.sw == 0) kws_[nkw++] = kw;
      }
      const int64_t nt = nkh * nkw;
      wsel_.resize(std::max<int64_t>(1, nt) * Cp_);
      for (int64_t i = 0; i < nkh; ++i) {
        for (int64_t k = 0; k < nkw; ++k) {
          std::memcpy(wsel_.data() + (i * nkw + k) * Cp_, wp_ + (khs_[i] * g.KW + kws_[k]) * Cp_, sizeof(A) * Cp_);
        }
      }
      for (int64_t c0 = ph; c0 < g.W;) {
        const int64_t c3 = c0 + 3 * g.sw;
        const bool interior =
            nt > 0 && c3 < g.W && c0 + g.pl - kws_[nkw - 1] * g.dw >= 0 && (c3 + g.pl - kws_[0] * g.dw) / g.sw < g.OW;
        if (!interior) {
          pixel(dxrow, gb, ih, c0);
          c0 += g.sw;
          continue;
        }
        int64_t t = 0;
        for (int64_t i = 0; i < nkh; ++i) {
          const T* grow = gb + ((ih + g.pt - khs_[i] * g.dh) / g.sh) * g.OW * g.C;
          for (int64_t k = 0; k < nkw; ++k) scratch_.src[t++] = grow + ((c0 + g.pl - kws_[k] * g.dw) / g.sw) * g.C;
        }
        nhwc_block4<T>(dxrow + c0 * g.C, g.sw * g.C, scratch_.src.data(), g.C, nt, wsel_.data(), Cp_, nullptr, g.C);
        c0 += 4 * g.sw;
      }
    }
  }

  const DepthwiseGeometry& g_;
  const A* wp_;
  const A* wflip_;
  int64_t Cp_, iw_lo_ = 0, iw_hi_ = 0;
  bool stream_, unit_ = false, few_ = false, row_block_ = false;
  NhwcRowScratch<T> scratch_;
  NhwcBorderColumns<T> border_;  // the grad_output columns of a block at the map's border
  std::vector<A> wsel_;
  int64_t khs_[64], kws_[64];
};

// ---- weight gradient -----------------------------------------------------------------------------

constexpr int64_t kTapGroup = 8;  // taps summed together: 8 accumulators stay in registers

// Output rows per weight-gradient item: a function of the shape only (never of the thread count),
// so the partition and with it every rounding is the same on every machine and every run.
int64_t wgrad_rows_per_item(const DepthwiseGeometry& g) {
  const int64_t total_rows = g.N * g.OH;
  const int64_t per_row = std::max<int64_t>(1, g.OW * g.C);
  const int64_t l2_rows = div_up(int64_t{1} << 16, per_row);  // ~64K elements of g per item: L2-resident
  int64_t rows = std::min(l2_rows, std::max<int64_t>(1, div_up(total_rows, 32)));  // at least ~32 items
  // Short rows (small maps) left that 4 output rows per item, and the fixed cost of an item (per
  // channel vector and kernel row: setup, border columns, partial sums written and added) was then
  // a large share of it: 7x7 kernels on 7x7 / 14x14 maps ran 1.2-1.5x slower, 3x3 ~1.1x (thread
  // time, 1 thread). There items grow up to ~8 items, while each accumulator still adds at most
  // 512 terms in a row (what the rule above gives 64-wide rows; longer chains lose fp32 precision).
  const int64_t short_rows = std::min(div_up(total_rows, 8), std::max<int64_t>(1, 512 / std::max<int64_t>(1, g.OW)));
  rows = std::max(rows, std::min(l2_rows, short_rows));
  return std::max<int64_t>(1, rows);
}

// acc[j] += g[o] * x[o * xstep + j * tstep] over n output columns, NK taps in registers.
template <typename T, int NK, typename Load>
inline void wgrad_interior(OpmathVec<T>* acc, const T* g, const T* x, int64_t n, int64_t gstep, int64_t xstep,
                           int64_t tstep, const Load& load) {
  OpmathVec<T> a[NK];
  static_for<NK>([&](auto j) { a[j] = acc[j]; });
  for (int64_t o = 0; o < n; ++o) {
    const OpmathVec<T> gv = load(g + o * gstep);
    const T* xo = x + o * xstep;
    static_for<NK>([&](auto j) { a[j] = at::vec::fmadd(gv, load(xo + j * tstep), a[j]); });
  }
  static_for<NK>([&](auto j) { acc[j] = a[j]; });
}

// The same sums for column dilation 1 and column stride S, four output columns at a time: input
// vector u = j*S + k feeds tap k of column j, so 3*S + NK loads serve 4*NK FMAs. Each acc[k] still
// adds its terms in increasing output column, so the result is bitwise that of wgrad_interior.
template <typename T, int NK, int S, typename Load>
inline void wgrad_interior_reuse(OpmathVec<T>* acc, const T* g, const T* x, int64_t n, int64_t C, const Load& load) {
  constexpr int P = 4;
  constexpr int U = S * (P - 1) + NK;
  OpmathVec<T> a[NK];
  static_for<NK>([&](auto k) { a[k] = acc[k]; });
  int64_t o = 0;
  for (; o + P <= n; o += P) {
    OpmathVec<T> gv[P];
    static_for<P>([&](auto j) { gv[j] = load(g + (o + j) * C); });
    const T* xo = x + o * S * C;
    static_for<U>([&](auto u) {
      const OpmathVec<T> xv = load(xo + u * C);
      static_for<P>([&](auto j) {
        constexpr int k = decltype(u)::value - decltype(j)::value * S;
        if constexpr (k >= 0 && k < NK) a[k] = at::vec::fmadd(gv[j], xv, a[k]);
      });
    });
  }
  for (; o < n; ++o) {
    const OpmathVec<T> gv = load(g + o * C);
    const T* xo = x + o * S * C;
    static_for<NK>([&](auto k) { a[k] = at::vec::fmadd(gv, load(xo + k * C), a[k]); });
  }
  static_for<NK>([&](auto k) { acc[k] = a[k]; });
}

// acc[j] += the sums of the ni interior output columns starting at gi (taps of the group all in
// bounds; xs: the input under the group's first tap): fixed trip counts for 3, 5 and 7 taps, with
// input-vector reuse at column dilation 1 and stride 1 or 2.
template <typename T, typename Load>
inline void wgrad_interior_columns(OpmathVec<T>* acc, int64_t nk, const T* gi, const T* xs, int64_t ni,
                                   const DepthwiseGeometry& g, const Load& load) {
  const int64_t xstep = g.sw * g.C, tstep = g.dw * g.C;
  const bool reuse = g.dw == 1 && (g.sw == 1 || g.sw == 2) && (nk == 3 || nk == 5 || nk == 7);
  if (reuse) {
    const bool s1 = g.sw == 1;
    if (nk == 3) {
      s1 ? wgrad_interior_reuse<T, 3, 1>(acc, gi, xs, ni, g.C, load)
         : wgrad_interior_reuse<T, 3, 2>(acc, gi, xs, ni, g.C, load);
    } else if (nk == 5) {
      s1 ? wgrad_interior_reuse<T, 5, 1>(acc, gi, xs, ni, g.C, load)
         : wgrad_interior_reuse<T, 5, 2>(acc, gi, xs, ni, g.C, load);
    } else {
      s1 ? wgrad_interior_reuse<T, 7, 1>(acc, gi, xs, ni, g.C, load)
         : wgrad_interior_reuse<T, 7, 2>(acc, gi, xs, ni, g.C, load);
    }
    return;
  }
  switch (nk) {
    case 3:
      wgrad_interior<T, 3>(acc, gi, xs, ni, g.C, xstep, tstep, load);
      break;
    case 5:
      wgrad_interior<T, 5>(acc, gi, xs, ni, g.C, xstep, tstep, load);
      break;
    case 7:
      wgrad_interior<T, 7>(acc, gi, xs, ni, g.C, xstep, tstep, load);
      break;
    default:
      for (int64_t o = 0; o < ni; ++o) {
        const OpmathVec<T> gv = load(gi + o * g.C);
        for (int64_t j = 0; j < nk; ++j) acc[j] = at::vec::fmadd(gv, load(xs + o * xstep + j * tstep), acc[j]);
      }
  }
}

// The partial sums of taps (kh, k0 .. k0 + nk - 1) for the channel vector at c over output rows
// [r0, r1), stored to out[(kh * KW + kw) * Cp + c]: per row the border columns tap by tap, the
// interior ones (every tap of the group in bounds) by wgrad_interior_columns.
template <typename T, typename Load>
void tap_group_partials(opmath_t<T>* out, int64_t Cp, const T* gp, const T* xp, const DepthwiseGeometry& g, int64_t r0,
                        int64_t r1, int64_t c, int64_t kh, int64_t k0, const Load& load) {
  using V = OpmathVec<T>;
  const int64_t nk = std::min(kTapGroup, g.KW - k0);
  // Output columns whose taps k0 .. k0+nk-1 all land inside the row.
  const int64_t ow_lo = std::min(g.OW, div_up(std::max<int64_t>(0, g.pl - k0 * g.dw), g.sw));
  const int64_t lastv = g.W - 1 + g.pl - (k0 + nk - 1) * g.dw;
  const int64_t ow_hi = std::max(ow_lo, std::min(g.OW, lastv >= 0 ? lastv / g.sw + 1 : 0));
  V acc[kTapGroup];
  for (int64_t j = 0; j < kTapGroup; ++j) acc[j] = V(opmath_t<T>(0));
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / g.OH, oh = r % g.OH;
    const int64_t ih = oh * g.sh + kh * g.dh - g.pt;
    if (ih < 0 || ih >= g.H) continue;
    const T* grow = gp + r * g.OW * g.C + c;
    const T* xrow = xp + ((n * g.H + ih) * g.W) * g.C + c;
    auto border = [&](int64_t ow) {
      const V gv = load(grow + ow * g.C);
      const int64_t iw0 = ow * g.sw + k0 * g.dw - g.pl;
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t iw = iw0 + j * g.dw;
        if (iw >= 0 && iw < g.W) acc[j] = at::vec::fmadd(gv, load(xrow + iw * g.C), acc[j]);
      }
    };
    int64_t ow = 0;
    for (; ow < ow_lo; ++ow) border(ow);
    const T* xs = xrow + (ow * g.sw + k0 * g.dw - g.pl) * g.C;
    wgrad_interior_columns<T>(acc, nk, grow + ow * g.C, xs, ow_hi - ow, g, load);
    for (ow = ow_hi; ow < g.OW; ++ow) border(ow);
  }
  for (int64_t j = 0; j < nk; ++j) acc[j].store(out + (kh * g.KW + k0 + j) * Cp + c);
}

}  // namespace

// ---- NhwcForwardRow ------------------------------------------------------------------------------

template <typename T>
NhwcForwardRow<T>::NhwcForwardRow(const DepthwiseGeometry& g, const A* wt, int64_t Cp, const A* bias, bool stream)
    : g_(g), wp_(wt), bp_(bias), Cp_(Cp), stream_(stream), scratch_(g) {
  // Interior columns: every kw in bounds, ow*sw - pl >= 0 and ow*sw - pl + (KW-1)*dw <= W - 1.
  ow_lo_ = std::min(g.OW, div_up(g.pl, g.sw));
  const int64_t last = g.W - 1 + g.pl - (g.KW - 1) * g.dw;
  ow_hi_ = std::max(ow_lo_, std::min(g.OW, last >= 0 ? last / g.sw + 1 : 0));
  row_block_ = has_row_block(g.KW, g.sw, g.dw);
  // Every pixel in row blocks at stride 1 only: at stride 2 the listed blocks measured slower than
  // the per-pixel border path (AVX2, 28x28 and 56x56 maps: 1.2x the time).
  if (row_block_ && g.sw == 1 && all_finite(wt, g.taps() * Cp)) {
    border_.enable(listed_block_pixels(g.OW), g.C, g.KH, g.KW);
  }
}

template <typename T>
void NhwcForwardRow<T>::run(T* out, const T* xb, int64_t oh, int64_t ow_begin, int64_t ow_end) {
  const DepthwiseGeometry& g = g_;
  // Pixel ow lives at out + (ow - ow_begin) * C.
  auto at_px = [&](int64_t o) { return out + (o - ow_begin) * g.C; };
  // Rows in bounds for this output row; the interior blocks use them with every kw.
  int64_t kh0 = 0, kh1 = g.KH;
  while (kh0 < g.KH && oh * g.sh + kh0 * g.dh - g.pt < 0) ++kh0;
  while (kh1 > kh0 && oh * g.sh + (kh1 - 1) * g.dh - g.pt >= g.H) --kh1;
  const A* wrows = wp_ + kh0 * g.KW * Cp_;
  const int64_t nt_in = (kh1 - kh0) * g.KW;
  auto pixel = [&](int64_t o) {
    int64_t nt = 0;
    for (int64_t kh = kh0; kh < kh1; ++kh) {
      const int64_t ih = oh * g.sh + kh * g.dh - g.pt;
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        const int64_t iw = o * g.sw + kw * g.dw - g.pl;
        if (iw < 0 || iw >= g.W) continue;
        scratch_.off[nt] = (ih * g.W + iw) * g.C;
        scratch_.tap[nt++] = kh * g.KW + kw;
      }
    }
    nhwc_pixel<T>(at_px(o), xb, scratch_.off.data(), scratch_.tap.data(), nt, wp_, Cp_, bp_, g.C);
  };
  const int64_t nrows = kh1 - kh0;
  if (row_block_) {
    for (int64_t kh = kh0; kh < kh1; ++kh) scratch_.wrow_ptr[kh - kh0] = wp_ + kh * g.KW * Cp_;
  }
  // The column prefetch only where a pixel's channels span two prefetch distances: with fewer, the
  // line requested is a later column of the same block, already loaded, and the prefetches cost
  // registers (32 channels of fp32 at 112x112: 1.3x the time with them).
  const bool prefetch = g.C * int64_t(sizeof(T)) >= 2 * kColumnPrefetchBytes;
  // A block of P pixels from o: inside the image through row pointers, else through the column list.
  const auto row_block_with = [&](auto prefetch_columns, int64_t o, int64_t P) {
    constexpr bool kPrefetch = decltype(prefetch_columns)::value;
    if (o >= ow_lo_ && o + P <= ow_hi_) {
      for (int64_t kh = kh0; kh < kh1; ++kh) {
        scratch_.row_ptr[kh - kh0] = xb + ((oh * g.sh + kh * g.dh - g.pt) * g.W + o * g.sw - g.pl) * g.C;
      }
      dispatch_row_block<T>(g.KW, g.sw, P, at_px(o), g.C, StridedColumns<T, kPrefetch>{scratch_.row_ptr.data()},
                            scratch_.wrow_ptr.data(), nrows, Cp_, bp_, stream_);
      return;
    }
    const int64_t U = (P - 1) * g.sw + g.KW;
    const T* const* cols = border_.list(nrows, U, o * g.sw - g.pl, g.W, g.C, [&](int64_t r) {
      return xb + (oh * g.sh + (kh0 + r) * g.dh - g.pt) * g.W * g.C;
    });
    dispatch_row_block<T>(g.KW, g.sw, P, at_px(o), g.C, ListedColumns<T, kPrefetch>{cols, U}, scratch_.wrow_ptr.data(),
                          nrows, Cp_, bp_, stream_);
  };
  const auto row_block_at = [&](int64_t o, int64_t P) {
    if (prefetch) {
      row_block_with(std::true_type{}, o, P);
    } else {
      row_block_with(std::false_type{}, o, P);
    }
  };
  if (border_.pixels > 0 && ow_end - ow_begin >= border_.pixels) {
    // Every pixel in row blocks, border pixels included (on a 7x7 map with a 3x3 kernel no block of 8
    // is interior, and 2 of 7 pixels are border pixels).
    for_each_row_block(ow_begin, ow_end, border_.pixels, row_block_at);
    return;
  }
  const int64_t hi = std::min(ow_hi_, ow_end);
  int64_t ow = ow_begin;
  for (; ow < std::min(ow_lo_, ow_end); ++ow) pixel(ow);
  if (row_block_) {
    const int64_t P = g.sw == 1 ? row_block_pixels<1>() : row_block_pixels<2>();
    for (; ow + P <= hi; ow += P) row_block_at(ow, P);
  }
  for (; ow + 4 <= hi; ow += 4) {
    int64_t t = 0;
    for (int64_t kh = kh0; kh < kh1; ++kh) {
      const T* xrow = xb + (oh * g.sh + kh * g.dh - g.pt) * g.W * g.C;
      for (int64_t kw = 0; kw < g.KW; ++kw) scratch_.src[t++] = xrow + (ow * g.sw + kw * g.dw - g.pl) * g.C;
    }
    nhwc_block4<T>(at_px(ow), g.C, scratch_.src.data(), g.sw * g.C, nt_in, wrows, Cp_, bp_, g.C);
  }
  for (; ow < ow_end; ++ow) pixel(ow);
}

namespace {

// ---- the kernels ---------------------------------------------------------------------------------

// Whether the row blocks write `out` (NHWC, C channels) in streaming stores: fp32 outputs too large to
// stay in the caches, whose every pixel starts on a whole vector. Measured, 1 thread, alternating
// in one process, 7 layers of the bench at batch 32: forward 1.33x faster on AVX-512 (geomean) and
// 1.29x on AVX2, input gradient 1.19x and 1.11x.
template <typename T>
bool stream_output(const at::Tensor& out, int64_t C) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    constexpr int64_t L = at::vec::Vectorized<float>::size();
    return C % L == 0 && reinterpret_cast<std::uintptr_t>(out.const_data_ptr<float>()) % (L * sizeof(float)) == 0 &&
           streaming_stores_pay(out.numel() * int64_t(sizeof(float)), at::get_num_threads());
  }
}

// Elements of the zero-padded image copy of forward_padded_images, or 0 when the shape does not
// take that path: 5/7-wide kernels at stride 1 or 2 whose padded image stays L2-resident (1 MiB).
// 3x3 measured slower with the copy: it does 9 FMAs per element, so copying the image costs as much
// as its border pixels save. For 7x7 (49 FMAs per element) the copy pays even on 56x56 maps, where
// only 8 of 56 pixels per row are border pixels: with fewer than 4 vectors of channels those run
// one dependent FMA chain per vector (ConvNeXt-atto's C = 40 forward: 1.13x faster). Stride 2 only:
// at stride 1 the row path runs border pixels in row blocks too (NhwcForwardRow), without the copy,
// and measured faster on ConvNeXt-atto's four 7x7 layers: 8-20% on AVX-512, 3-35% on AVX2.
template <typename T>
int64_t padded_image_elements(const DepthwiseGeometry& g, int64_t P) {
  if (g.KW < 5 || g.sw == 1 || !has_row_block(g.KW, g.sw, g.dw)) return 0;
  const int64_t rows = (g.OH - 1) * g.sh + (g.KH - 1) * g.dh + 1;
  const int64_t cols = (round_up(g.OW, P) - 1) * g.sw + g.KW;
  const int64_t elements = rows * cols * g.C;
  return elements * int64_t(sizeof(T)) <= (int64_t{1} << 20) ? elements : 0;
}

// The forward with one image per task, copied once into a zero-padded scratch whose rows are
// rounded up to whole row blocks: every pixel then runs the register row block, none the per-pixel
// tap list (on a 7x7 map with a 7x7 kernel, 6 of 7 pixels are border pixels). The scratch's zero
// border is written once per task: each image overwrites only the interior. Output rows go through
// a row of scratch, so the last partial block needs no special case.
template <typename T>
void forward_padded_images(const T* xp, const opmath_t<T>* wp, int64_t Cp, const opmath_t<T>* bp, T* yp,
                           const DepthwiseGeometry& g, int64_t P, int64_t elements) {
  const int64_t rows = (g.OH - 1) * g.sh + (g.KH - 1) * g.dh + 1;
  const int64_t cols = elements / (rows * g.C);
  const int64_t C = g.C;
  at::parallel_for(0, g.N, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> img(elements);  // zero: the padding
    std::vector<T> out_row(round_up(g.OW, P) * C);
    std::vector<const T*> row_ptr(g.KH);
    std::vector<const opmath_t<T>*> wrow_ptr(g.KH);
    for (int64_t kh = 0; kh < g.KH; ++kh) wrow_ptr[kh] = wp + kh * g.KW * Cp;
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t ih = r - g.pt;
        if (ih < 0 || ih >= g.H) continue;
        const int64_t iw0 = std::max<int64_t>(0, -g.pl), iw1 = std::min(g.W, cols - g.pl);
        if (iw1 > iw0) {
          std::memcpy(img.data() + (r * cols + iw0 + g.pl) * C, xp + ((n * g.H + ih) * g.W + iw0) * C,
                      sizeof(T) * (iw1 - iw0) * C);
        }
      }
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        for (int64_t ow = 0; ow < g.OW; ow += P) {
          for (int64_t kh = 0; kh < g.KH; ++kh) {
            row_ptr[kh] = img.data() + ((oh * g.sh + kh * g.dh) * cols + ow * g.sw) * C;
          }
          dispatch_row_block<T>(g.KW, g.sw, P, out_row.data() + ow * C, C, StridedColumns<T, false>{row_ptr.data()},
                                wrow_ptr.data(), g.KH, Cp, bp);
        }
        std::memcpy(yp + (n * g.OH + oh) * g.OW * C, out_row.data(), sizeof(T) * g.OW * C);
      }
    }
  });
}

template <typename T>
void forward(const at::Tensor& x, const at::Tensor& wt, const at::Tensor& bt, at::Tensor& y,
             const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  const T* xp = x.const_data_ptr<T>();
  T* yp = y.data_ptr<T>();
  const A* bp = bt.defined() ? bt.const_data_ptr<A>() : nullptr;
  const int64_t P = g.sw == 1 ? row_block_pixels<1>() : row_block_pixels<2>();
  const int64_t elements = padded_image_elements<T>(g, P);
  if (elements > 0 && all_finite(wt.const_data_ptr<A>(), wt.numel())) {
    forward_padded_images<T>(xp, wt.const_data_ptr<A>(), wt.size(1), bp, yp, g, P, elements);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, g.OW * g.C));
  const bool stream = stream_output<T>(y, g.C);
  at::parallel_for(0, g.N * g.OH, grain, [&](int64_t begin, int64_t end) {
    NhwcForwardRow<T> row(g, wt.const_data_ptr<A>(), wt.size(1), bp, stream);
    for (int64_t r = begin; r < end; ++r) {
      row.run(yp + r * g.OW * g.C, xp + (r / g.OH) * g.H * g.W * g.C, r % g.OH, 0, g.OW);
    }
    if (stream) stream_fence();
  });
}

template <typename T>
void backward_input(const at::Tensor& go, const at::Tensor& wt, at::Tensor& dx, const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  const int64_t Cp = wt.size(1);
  const T* gp = go.const_data_ptr<T>();
  T* dxp = dx.data_ptr<T>();
  const A* wp = wt.const_data_ptr<A>();
  std::vector<A> wflip;
  if (g.sw == 1 && has_row_block(g.KW, 1, g.dw)) wflip = mirrored_weights(wp, g, Cp);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, g.W * g.C));
  const bool stream = stream_output<T>(dx, g.C);
  at::parallel_for(0, g.N * g.H, grain, [&](int64_t begin, int64_t end) {
    NhwcInputGradRow<T> row(g, wp, wflip.data(), Cp, stream);
    for (int64_t r = begin; r < end; ++r) row.run(dxp + r * g.W * g.C, gp + (r / g.H) * g.OH * g.OW * g.C, r % g.H);
    if (stream) stream_fence();
  });
}

template <typename T>
at::Tensor weight_partials(const at::Tensor& go, const at::Tensor& x, const DepthwiseGeometry& g) {
  using A = opmath_t<T>;
  using V = at::vec::Vectorized<A>;
  constexpr int64_t L = V::size();
  const int64_t rows_per_item = wgrad_rows_per_item(g);
  const int64_t total_rows = g.N * g.OH;
  const int64_t items = div_up(total_rows, rows_per_item);
  const int64_t Cp = round_up(g.C, L);
  const int64_t taps = g.taps();
  at::Tensor ws = at::empty({items, taps + 1, Cp}, x.options().dtype(c10::CppTypeToScalarType<A>::value));
  const T* xp = x.const_data_ptr<T>();
  const T* gp = go.const_data_ptr<T>();
  A* wsp = ws.data_ptr<A>();
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r0 = item * rows_per_item, r1 = std::min(total_rows, r0 + rows_per_item);
      A* out = wsp + item * (taps + 1) * Cp;
      for (int64_t c = 0; c < g.C; c += L) {
        const int64_t cnt = std::min(L, g.C - c);
        auto load = [&](const T* ptr) { return cnt == L ? load_opmath<T>(ptr) : load_opmath<T>(ptr, cnt); };
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          for (int64_t k0 = 0; k0 < g.KW; k0 += kTapGroup) {
            tap_group_partials<T>(out, Cp, gp, xp, g, r0, r1, c, kh, k0, load);
          }
        }
        V bacc(A(0));
        for (int64_t r = r0; r < r1; ++r) {
          const T* grow = gp + r * g.OW * g.C + c;
          for (int64_t ow = 0; ow < g.OW; ++ow) bacc = bacc + load(grow + ow * g.C);
        }
        bacc.store(out + taps * Cp + c);
      }
    }
  });
  return ws;
}

}  // namespace

template <typename T>
DepthwiseLayoutKernels<T> nhwc_kernels() {
  return {&forward<T>, &backward_input<T>, &weight_partials<T>};
}

template DepthwiseLayoutKernels<float> nhwc_kernels<float>();
template DepthwiseLayoutKernels<double> nhwc_kernels<double>();
template DepthwiseLayoutKernels<c10::Half> nhwc_kernels<c10::Half>();
template DepthwiseLayoutKernels<c10::BFloat16> nhwc_kernels<c10::BFloat16>();
template class NhwcForwardRow<float>;
template class NhwcForwardRow<double>;
template class NhwcForwardRow<c10::Half>;
template class NhwcForwardRow<c10::BFloat16>;

}  // namespace CPU_CAPABILITY
}  // namespace fastops::cpu
