// The one TORCH_LIBRARY(fastops, m), holding _build_info, and the fastops._C Python module. Each op's
// schemas, autograd (double backward included) and autocast live with it in csrc/<op>_op.cpp (a
// TORCH_LIBRARY_FRAGMENT); its kernels register themselves per device in cpu/<op>.cpp and
// cuda/<op>.cu, and Python adds only the fake kernels, in fastops/ops/<op>.py.
#include <Python.h>
#include <fastops/cpu_capability.h>
#include <torch/library.h>

#include <string>

#define FASTOPS_STRINGIFY_(x) #x
#define FASTOPS_STRINGIFY(x) FASTOPS_STRINGIFY_(x)

namespace fastops {
extern PyMethodDef python_methods[];  // csrc/tuner.cpp
extern PyMethodDef error_methods[];   // csrc/errors.cpp
}  // namespace fastops

// fastops._C is imported as a Python module (the setup.py build as fastops._C, the JIT build under
// its own name); every op is reached through torch.ops.fastops, and its only Python functions are the
// tuner's call key (csrc/tuner.cpp) and the registration of the checks' error types (csrc/errors.cpp).
// The init function's name follows the extension's name so the same source serves both builds.
#define FASTOPS_CONCAT_(a, b) a##b
#define FASTOPS_CONCAT(a, b) FASTOPS_CONCAT_(a, b)
extern "C" PyObject* FASTOPS_CONCAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, FASTOPS_STRINGIFY(TORCH_EXTENSION_NAME),
                                   "fastops compiled kernels (reached through torch.ops.fastops)", -1,
                                   fastops::python_methods};
  PyObject* module = PyModule_Create(&module_def);
  if (module != nullptr && PyModule_AddFunctions(module, fastops::error_methods) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}

namespace fastops {

#ifdef FASTOPS_WITH_CUDA
std::string cuda_build_info();  // csrc/cuda/build_info.cu
#endif

// "key=value;..." describing how this binary was compiled; parsed by fastops/info.py.
std::string build_info() {
  std::string info = std::string("cpu_capability=") + cpu::capability_name(cpu::running_capability()) +
                     ";cpu_capabilities_built=" + cpu::built_capabilities();
#ifdef FASTOPS_WITH_CUDA
  info += ";cuda=1;" + cuda_build_info();
#else
  info += ";cuda=0";
#endif
  return info;
}

}  // namespace fastops

TORCH_LIBRARY(fastops, m) { m.def("_build_info() -> str", &fastops::build_info); }
