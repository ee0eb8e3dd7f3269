"""fastops::FastDivmod (csrc/include/fastops/fast_divmod.h), the CUDA kernels' division by a launch-time
divisor, checked on the host: the same header, compiled here, against `/` and `%` for divisors and
dividends over the whole range it promises (below 2^31), edges included."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

INCLUDE = Path(__file__).resolve().parent.parent / "csrc" / "include"
SOURCE = r"""
#include <torch/extension.h>
#include <fastops/fast_divmod.h>

#include <cstdint>
#include <random>

// The number of (n, d) pairs where FastDivmod disagrees with / or %: every divisor in [1, small_d] and
// the edges of large ones, each with n at the multiples of d and their neighbours, plus random pairs.
int64_t mismatches(int64_t small_d, int64_t random_pairs) {
  int64_t bad = 0;
  auto check = [&](uint32_t n, uint32_t d) {
    const fastops::FastDivmod f(d);
    if (f.div(n) != n / d || f.mod(n) != n % d) ++bad;
  };
  const uint32_t top = (uint32_t{1} << 31) - 1;
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= static_cast<uint32_t>(small_d); ++d) divisors.push_back(d);
  for (uint32_t k = 1; k < 31; ++k) {
    for (int64_t delta = -2; delta <= 2; ++delta) {
      const int64_t d = (int64_t{1} << k) + delta;
      if (d >= 1 && d <= top) divisors.push_back(static_cast<uint32_t>(d));
    }
  }
  divisors.push_back(top);
  for (uint32_t d : divisors) {
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, top, top - 1, top - d + 1}) {
      if (n <= top) check(n, d);
    }
    for (uint64_t q : {2ull, 3ull, 1000ull, 65537ull}) {
      const uint64_t n = q * d;
      if (n + 1 <= top) {
        check(static_cast<uint32_t>(n - 1), d);
        check(static_cast<uint32_t>(n), d);
        check(static_cast<uint32_t>(n + 1), d);
      }
    }
  }
  std::mt19937_64 gen(20261127);
  for (int64_t i = 0; i < random_pairs; ++i) {
    const uint32_t d = static_cast<uint32_t>(gen() % top) + 1;
    const uint32_t n = static_cast<uint32_t>(gen() % (uint64_t{top} + 1));
    check(n, d);
    check(n, static_cast<uint32_t>(gen() % 4096) + 1);  // the small divisors kernels use most
  }
  return bad;
}

// IndexDivider against / and %: FastDivmod below 2^31, 64-bit division from there on (a dividend or a
// divisor at or past 2^31 takes it), the choice made from the largest dividend.
int64_t index_divider_mismatches() {
  int64_t bad = 0;
  const int64_t limit = int64_t{1} << 31;
  std::mt19937_64 gen(7);
  for (const int64_t max_dividend : {int64_t{1000}, limit - 1, limit, int64_t{1} << 40}) {
    for (const int64_t d : {int64_t{1}, int64_t{3}, int64_t{640}, limit - 1, limit, int64_t{5} << 33}) {
      const fastops::IndexDivider f(d, max_dividend);
      if (f.use_fast != (d < limit && max_dividend < limit)) ++bad;
      for (int k = 0; k < 2000; ++k) {
        const int64_t n = k < 3 ? std::vector<int64_t>{0, max_dividend, d - 1}[k] % (max_dividend + 1)
                                : static_cast<int64_t>(gen() % static_cast<uint64_t>(max_dividend + 1));
        if (f.div(n) != n / d || f.mod(n) != n % d) ++bad;
      }
    }
  }
  return bad;
}

// A wrong multiplier must be caught: the same check with magic - 1 (for d = 3, 7, 641).
int64_t mismatches_with_a_wrong_magic() {
  int64_t bad = 0;
  for (uint32_t d : {3u, 7u, 641u}) {
    fastops::FastDivmod f(d);
    f.magic -= 1;
    for (uint32_t n = 0; n < (uint32_t{1} << 31) - 1 - 97; n += 97) {
      if (f.div(n) != n / d) ++bad;
    }
  }
  return bad;
}
"""


@pytest.fixture(scope="module")
def ext():  # noqa: ANN201 (a compiled module)
    from torch.utils.cpp_extension import load_inline

    digest = hashlib.sha256((INCLUDE / "fastops" / "fast_divmod.h").read_bytes()).hexdigest()
    return load_inline(
        "fastops_test_fast_divmod",
        cpp_sources=f"{SOURCE}\n// header {digest}\n",
        functions=["mismatches", "mismatches_with_a_wrong_magic", "index_divider_mismatches"],
        extra_include_paths=[str(INCLUDE)],
        extra_cflags=["-O2"],
    )


def test_fast_divmod_matches_division_below_2_31(ext) -> None:  # noqa: ANN001
    assert ext.mismatches(70000, 2_000_000) == 0


def test_index_divider_takes_the_fast_path_only_below_2_31(ext) -> None:  # noqa: ANN001
    assert ext.index_divider_mismatches() == 0


def test_the_check_sees_a_wrong_multiplier(ext) -> None:  # noqa: ANN001
    assert ext.mismatches_with_a_wrong_magic() > 0
