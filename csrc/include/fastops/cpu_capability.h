// The CPU kernels' ISA levels, and how the code compiled once reaches the level that runs.
//
// csrc/cpu/*.cpp is compiled once per x86 vector ISA level, as ATen's kernels are: DEFAULT (no x86
// flags: any CPU, any architecture), AVX2 (-mavx2 -mfma -mf16c) and AVX512 (-mavx512f/bw/vl/dq), each
// time with CPU_CAPABILITY defined to the level's name, so that every function of a level (its
// kernels, the inline helpers of cpu_vec_math.h and the other CPU-only headers, and at::vec's
// Vectorized) lives in that level's namespace, fastops::cpu::DEFAULT, ::AVX2 or ::AVX512. No function
// is shared between levels, so no AVX-512 instruction is reachable from the DEFAULT level. The rest
// of csrc/ (schemas, autograd, autocast, registration) is compiled once, without ISA flags, and does
// not define CPU_CAPABILITY.
//
// The level is chosen once, when the library loads (running_capability): the best one this CPU
// supports among those built, or the one FASTOPS_CPU_CAPABILITY names. The registration of an op's
// CPU kernels (in csrc/<op>_op.cpp, compiled once) declares them with FASTOPS_DECLARE_CPU_KERNEL and
// registers FASTOPS_CPU_KERNEL(name), the running level's function, so a call costs no dispatch of
// its own. The once-compiled code knows which levels were built from FASTOPS_CPU_BUILT_AVX2 and
// FASTOPS_CPU_BUILT_AVX512 (set by fastops/_build.py).
#pragma once

#include <string>

namespace fastops::cpu {

enum class Capability : int { kDefault = 0, kAvx2 = 1, kAvx512 = 2 };

// The level whose kernels run in this process (csrc/cpu_capability.cpp); decided on the first call.
Capability running_capability();
// "default", "avx2" or "avx512".
const char* capability_name(Capability capability);
// The levels compiled into this library, best last, comma-separated: "default,avx2,avx512".
std::string built_capabilities();

template <typename T>
struct TypeIdentity {
  using type = T;
};

// The running level's kernel among the built ones (a level that was not built passes nullptr).
template <typename Fn>
Fn* running_kernel(Fn* default_kernel, typename TypeIdentity<Fn>::type* avx2_kernel,
                   typename TypeIdentity<Fn>::type* avx512_kernel) {
  switch (running_capability()) {
    case Capability::kAvx512:
      return avx512_kernel;
    case Capability::kAvx2:
      return avx2_kernel;
    default:
      return default_kernel;
  }
}

}  // namespace fastops::cpu

// Declares the CPU kernel `name`, of function type __VA_ARGS__: in a level's translation unit in that
// level's namespace; in code compiled once, in every level's namespace, for FASTOPS_CPU_KERNEL.
#if defined(CPU_CAPABILITY)
#define FASTOPS_DECLARE_CPU_KERNEL(name, ...)           \
  namespace fastops::cpu {                              \
  inline namespace CPU_CAPABILITY {                     \
  ::fastops::cpu::TypeIdentity<__VA_ARGS__>::type name; \
  }                                                     \
  }
#else
#define FASTOPS_DECLARE_CPU_KERNEL(name, ...)           \
  namespace fastops::cpu {                              \
  namespace DEFAULT {                                   \
  ::fastops::cpu::TypeIdentity<__VA_ARGS__>::type name; \
  }                                                     \
  namespace AVX2 {                                      \
  ::fastops::cpu::TypeIdentity<__VA_ARGS__>::type name; \
  }                                                     \
  namespace AVX512 {                                    \
  ::fastops::cpu::TypeIdentity<__VA_ARGS__>::type name; \
  }                                                     \
  }

#if defined(FASTOPS_CPU_BUILT_AVX2)
#define FASTOPS_CPU_AVX2_KERNEL(name) &::fastops::cpu::AVX2::name
#else
#define FASTOPS_CPU_AVX2_KERNEL(name) nullptr
#endif
#if defined(FASTOPS_CPU_BUILT_AVX512)
#define FASTOPS_CPU_AVX512_KERNEL(name) &::fastops::cpu::AVX512::name
#else
#define FASTOPS_CPU_AVX512_KERNEL(name) nullptr
#endif

// The kernel `name` of the level that runs (declared with FASTOPS_DECLARE_CPU_KERNEL).
#define FASTOPS_CPU_KERNEL(name)                                                                \
  ::fastops::cpu::running_kernel(&::fastops::cpu::DEFAULT::name, FASTOPS_CPU_AVX2_KERNEL(name), \
                                 FASTOPS_CPU_AVX512_KERNEL(name))
#endif
