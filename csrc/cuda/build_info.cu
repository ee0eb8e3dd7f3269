// Reports which CUDA archs and toolkit this binary was compiled with (python -m fastops.info).
#include <cuda_runtime_api.h>

#include <string>

namespace fastops {

#define FASTOPS_STRINGIFY_(...) #__VA_ARGS__
#define FASTOPS_STRINGIFY(...) FASTOPS_STRINGIFY_(__VA_ARGS__)

std::string cuda_build_info() {
  std::string info = "cuda_runtime=" + std::to_string(CUDART_VERSION);
#ifdef __CUDA_ARCH_LIST__
  // nvcc defines it in host code too: the comma-separated archs of this compilation, e.g. 800,900.
  info += ";cuda_archs=" FASTOPS_STRINGIFY(__CUDA_ARCH_LIST__);
#endif
  return info;
}

}  // namespace fastops
