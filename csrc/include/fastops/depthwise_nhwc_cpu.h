// CPU-only building blocks of the channels_last (NHWC) depthwise forward, shared by
// cpu/depthwise_conv2d.cpp and cpu/depthwise_separable_conv2d.cpp (at::vec: never include from .cu).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/ops/zeros.h>
#include <fastops/cpu_vec_math.h>
#include <fastops/depthwise.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace fastops::cpu {

// ---- NHWC ------------------------------------------------------------------------------------------

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

// P neighbouring output pixels of one row for a K-wide kernel at column stride S and column
// dilation 1, all taps in bounds: out[j] = init + sum_r sum_kw w_r[kw] * x_r[j*S + kw]. Each input
// vector x_r[u] is loaded once and feeds every (j, kw) with j*S + kw == u, so a row of K taps costs
// S*(P-1) + K loads for P*K FMAs (the 4-pixel block above loads P*K). rows[r] points at pixel 0's
// first tap in input row r; wrows[r] at that row's K weight vectors ([K][Cp]).
template <typename T, int K, int S, int P, bool Full>
inline void nhwc_row_block_c(T* out, int64_t C, const T* const* rows, const opmath_t<T>* const* wrows, int64_t nrows,
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
    const T* xr = rows[r] + c;
    static_for<U>([&](auto u) {
      const V xv = Full ? load_opmath<T>(xr + u * C) : load_opmath<T>(xr + u * C, cnt);
      static_for<K>([&](auto kw) {
        constexpr int d = decltype(u)::value - decltype(kw)::value;
        if constexpr (d >= 0 && d % S == 0 && d / S < P) acc[d / S] = at::vec::fmadd(xv, wv[kw], acc[d / S]);
      });
    });
  }
  static_for<P>([&](auto j) { store_opmath<T>(out + j * C + c, acc[j], cnt); });
}

template <typename T, int K, int S, int P>
inline void nhwc_row_block(T* out, int64_t C, const T* const* rows, const opmath_t<T>* const* wrows, int64_t nrows,
                           int64_t Cp, const opmath_t<T>* init) {
  constexpr int64_t L = at::vec::Vectorized<opmath_t<T>>::size();
  int64_t c = 0;
  for (; c + L <= C; c += L) nhwc_row_block_c<T, K, S, P, true>(out, C, rows, wrows, nrows, Cp, init, c, L);
  if (c < C) nhwc_row_block_c<T, K, S, P, false>(out, C, rows, wrows, nrows, Cp, init, c, C - c);
}

// Pixels per register block: 8 at stride 1, 4 at stride 2 (so 16 vector registers suffice).
template <int S>
constexpr int64_t row_block_pixels() {
  return S == 1 ? 8 : 4;
}

// Runs nhwc_row_block for a runtime (K, S) in {3, 5, 7} x {1, 2}; false when there is no variant.
template <typename T>
bool dispatch_row_block(int64_t K, int64_t S, T* out, int64_t C, const T* const* rows, const opmath_t<T>* const* wrows,
                        int64_t nrows, int64_t Cp, const opmath_t<T>* init) {
#define FASTOPS_ROW_BLOCK(KK, SS)                                                            \
  if (K == KK && S == SS) {                                                                  \
    nhwc_row_block<T, KK, SS, row_block_pixels<SS>()>(out, C, rows, wrows, nrows, Cp, init); \
    return true;                                                                             \
  }
  FASTOPS_ROW_BLOCK(3, 1)
  FASTOPS_ROW_BLOCK(3, 2)
  FASTOPS_ROW_BLOCK(5, 1)
  FASTOPS_ROW_BLOCK(5, 2)
  FASTOPS_ROW_BLOCK(7, 1)
  FASTOPS_ROW_BLOCK(7, 2)
#undef FASTOPS_ROW_BLOCK
  return false;
}

inline bool has_row_block(int64_t K, int64_t S, int64_t D) {
  return D == 1 && (K == 3 || K == 5 || K == 7) && (S == 1 || S == 2);
}
// One output row of the NHWC forward, pixels [ow_begin, ow_end): border pixels tap by tap; interior
// pixels (every kw in bounds) in register blocks, where the valid (kh, kw) taps of the row are the
// contiguous weight rows wt[kh0 * KW ...]. Pixel ow goes to out + (ow - ow_begin) * C. wt is the
// (taps, Cp) weight of weights_acc(..., transposed=true), bias the (Cp,) of bias_acc or nullptr.
// Holds per-thread scratch: make one per task.
template <typename T>
class NhwcForwardRow {
 public:
  using A = opmath_t<T>;
  NhwcForwardRow(const DepthwiseGeometry& g, const A* wt, int64_t Cp, const A* bias)
      : g_(g),
        wp_(wt),
        bp_(bias),
        Cp_(Cp),
        off_(g.taps()),
        tap_(g.taps()),
        src_(g.taps()),
        row_ptr_(g.KH),
        wrow_ptr_(g.KH) {
    // Interior columns: every kw in bounds, ow*sw - pl >= 0 and ow*sw - pl + (KW-1)*dw <= W - 1.
    ow_lo_ = std::min(g.OW, div_up(g.pl, g.sw));
    const int64_t last = g.W - 1 + g.pl - (g.KW - 1) * g.dw;
    ow_hi_ = std::max(ow_lo_, std::min(g.OW, last >= 0 ? last / g.sw + 1 : 0));
    row_block_ = has_row_block(g.KW, g.sw, g.dw);
  }

  // xb: image n of the NHWC input.
  void run(T* out, const T* xb, int64_t oh, int64_t ow_begin, int64_t ow_end) {
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
          off_[nt] = (ih * g.W + iw) * g.C;
          tap_[nt++] = kh * g.KW + kw;
        }
      }
      nhwc_pixel<T>(at_px(o), xb, off_.data(), tap_.data(), nt, wp_, Cp_, bp_, g.C);
    };
    const int64_t hi = std::min(ow_hi_, ow_end);
    int64_t ow = ow_begin;
    for (; ow < std::min(ow_lo_, ow_end); ++ow) pixel(ow);
    if (row_block_) {
      const int64_t P = g.sw == 1 ? row_block_pixels<1>() : row_block_pixels<2>();
      for (int64_t kh = kh0; kh < kh1; ++kh) wrow_ptr_[kh - kh0] = wp_ + kh * g.KW * Cp_;
      for (; ow + P <= hi; ow += P) {
        for (int64_t kh = kh0; kh < kh1; ++kh) {
          row_ptr_[kh - kh0] = xb + ((oh * g.sh + kh * g.dh - g.pt) * g.W + ow * g.sw - g.pl) * g.C;
        }
        dispatch_row_block<T>(g.KW, g.sw, at_px(ow), g.C, row_ptr_.data(), wrow_ptr_.data(), kh1 - kh0, Cp_, bp_);
      }
    }
    for (; ow + 4 <= hi; ow += 4) {
      int64_t t = 0;
      for (int64_t kh = kh0; kh < kh1; ++kh) {
        const T* xrow = xb + (oh * g.sh + kh * g.dh - g.pt) * g.W * g.C;
        for (int64_t kw = 0; kw < g.KW; ++kw) src_[t++] = xrow + (ow * g.sw + kw * g.dw - g.pl) * g.C;
      }
      nhwc_block4<T>(at_px(ow), g.C, src_.data(), g.sw * g.C, nt_in, wrows, Cp_, bp_, g.C);
    }
    for (; ow < ow_end; ++ow) pixel(ow);
  }

 private:
  const DepthwiseGeometry& g_;
  const A* wp_;
  const A* bp_;
  int64_t Cp_, ow_lo_ = 0, ow_hi_ = 0;
  bool row_block_ = false;
  std::vector<int64_t> off_, tap_;
  std::vector<const T*> src_, row_ptr_;
  std::vector<const A*> wrow_ptr_;
};

// Weights as (C, taps) in the accumulation type (NCHW kernels) or transposed to (taps, Cp) with the
// channel dimension zero-padded to whole vectors (NHWC kernels).
inline at::Tensor weights_acc(const at::Tensor& weight, at::ScalarType acc, bool transposed, int64_t vec) {
  const int64_t C = weight.size(0), taps = weight.size(2) * weight.size(3);
  at::Tensor w = weight.reshape({C, taps}).to(acc);
  if (!transposed) return w.contiguous();
  at::Tensor wt = at::zeros({taps, round_up(std::max<int64_t>(C, 1), vec)}, weight.options().dtype(acc));
  wt.narrow(1, 0, C).copy_(w.t());
  return wt;
}

inline at::Tensor bias_acc(const std::optional<at::Tensor>& bias, at::ScalarType acc, int64_t vec) {
  if (!bias.has_value() || !bias->defined()) return at::Tensor();
  const int64_t C = bias->size(0);
  at::Tensor b = at::zeros({round_up(std::max<int64_t>(C, 1), vec)}, bias->options().dtype(acc));
  b.narrow(0, 0, C).copy_(*bias);
  return b;
}

}  // namespace fastops::cpu
