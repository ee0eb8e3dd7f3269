// Division by a divisor fixed at launch, as a multiply-high, an add and a shift (the method of Granlund
// and Montgomery, "Division by invariant integers using multiplication", 1994): for the index math of
// kernels that map a flat index to (row, column). On the GPU a 64-bit `/` or `%` is a call to a
// ~100-instruction subroutine, per use; this is 3 instructions. Exact for every dividend and divisor
// below 2^31 (tested on the host: tests/test_fast_divmod.py); IndexDivider keeps a 64-bit path beyond.
#pragma once

#include <c10/macros/Macros.h>

#include <cstdint>

namespace fastops {

constexpr int64_t kFastDivmodLimit = int64_t{1} << 31;  // dividends and divisors must stay below this

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t magic = 1;  // with shift: n / d = (umulhi(n, magic) + n) >> shift
  uint32_t shift = 0;

  FastDivmod() = default;
  // 1 <= d < 2^31. shift = ceil(log2(d)); magic = floor(2^32 (2^shift - d) / d) + 1 fits in 32 bits
  // since 2^shift - d < d.
  explicit FastDivmod(uint32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  C10_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(n, magic);
#else
    const uint32_t high = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return (high + n) >> shift;  // high <= n < 2^31: the sum fits in 32 bits
  }

  C10_HOST_DEVICE uint32_t mod(uint32_t n) const { return n - div(n) * divisor; }
};

// n / d and n % d for a kernel's index math (0 <= n <= max_dividend): FastDivmod when every dividend
// and d stay below 2^31, else 64-bit division. The choice is made once, at launch, so the branch is the
// same for every thread.
struct IndexDivider {
  FastDivmod fast;
  int64_t divisor = 1;
  bool use_fast = true;

  IndexDivider() = default;
  IndexDivider(int64_t d, int64_t max_dividend)
      : divisor(d), use_fast(d < kFastDivmodLimit && max_dividend < kFastDivmodLimit) {
    if (use_fast) fast = FastDivmod(static_cast<uint32_t>(d));
  }

  C10_HOST_DEVICE int64_t div(int64_t n) const {
    return use_fast ? static_cast<int64_t>(fast.div(static_cast<uint32_t>(n))) : n / divisor;
  }
  C10_HOST_DEVICE int64_t mod(int64_t n) const { return n - div(n) * divisor; }
};

}  // namespace fastops
