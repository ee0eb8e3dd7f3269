// Which ISA level of the CPU kernels runs (see fastops/cpu_capability.h): decided once, at the first
// registration of a CPU kernel, from what this CPU supports (CPUID), the levels built, and
// FASTOPS_CPU_CAPABILITY. fastops/_extension.py checks a forced level before it loads the library
// and raises a clear error for one that cannot run; here, where a static initializer cannot raise, an
// unusable request falls back to the best level that can run.
#include <fastops/cpu_capability.h>

#include <cctype>
#include <cstdlib>
#include <string>

namespace fastops::cpu {
namespace {

bool built(Capability capability) {
  switch (capability) {
    case Capability::kAvx512:
#if defined(FASTOPS_CPU_BUILT_AVX512)
      return true;
#else
      return false;
#endif
    case Capability::kAvx2:
#if defined(FASTOPS_CPU_BUILT_AVX2)
      return true;
#else
      return false;
#endif
    default:
      return true;
  }
}

// The same instruction sets the compiler flags of each level enable (fastops/_build.py).
bool cpu_supports(Capability capability) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  switch (capability) {
    case Capability::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case Capability::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    default:
      return true;
  }
#else
  return capability == Capability::kDefault;
#endif
}

bool usable(Capability capability) { return built(capability) && cpu_supports(capability); }

Capability choose() {
  Capability best = Capability::kDefault;
  for (Capability c : {Capability::kAvx2, Capability::kAvx512}) {
    if (usable(c)) best = c;
  }
  const char* env = std::getenv("FASTOPS_CPU_CAPABILITY");
  if (env == nullptr) return best;
  std::string requested;
  for (const char* ch = env; *ch != '\0'; ++ch) {
    if (!std::isspace(static_cast<unsigned char>(*ch))) {
      requested += static_cast<char>(std::tolower(static_cast<unsigned char>(*ch)));
    }
  }
  for (Capability c : {Capability::kDefault, Capability::kAvx2, Capability::kAvx512}) {
    if (requested == capability_name(c) && usable(c)) return c;
  }
  return best;
}

}  // namespace

Capability running_capability() {
  static const Capability running = choose();
  return running;
}

const char* capability_name(Capability capability) {
  switch (capability) {
    case Capability::kAvx512:
      return "avx512";
    case Capability::kAvx2:
      return "avx2";
    default:
      return "default";
  }
}

std::string built_capabilities() {
  std::string names = capability_name(Capability::kDefault);
  for (Capability c : {Capability::kAvx2, Capability::kAvx512}) {
    if (built(c)) names += std::string(",") + capability_name(c);
  }
  return names;
}

}  // namespace fastops::cpu
