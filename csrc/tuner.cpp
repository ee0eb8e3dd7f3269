// The kernel-choice tuner's per-call key (fastops/tuner.py). A fastops module remembers, per kind of
// input, whether its fastops kernel or PyTorch's was measured faster; finding that entry must cost
// far less than the kernel call itself (a few microseconds for a small tensor). Building the key in
// Python reads eight tensor attributes (~0.8 us); here it is one call that hashes what decides the
// choice into a 64-bit int (~0.1 us).
//
// call_signature(x, params) hashes: x's sizes, strides, dtype and device; whether autograd will
// differentiate the call (grad mode on and x, or one of the Tensors in the tuple params, requires
// grad); the CPU thread count; the autocast state of x's device type; deterministic mode. A
// collision could only make a module run the slower of two kernels that compute the same thing,
// never a wrong result. A non-Tensor x gives None (the op itself then names what it expected).
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <Python.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace fastops {
namespace {

// splitmix64's finaliser over a running value: cheap, and every input bit moves every output bit.
inline void mix(uint64_t& h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
}

PyObject* call_signature(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS  // a c10::Error becomes a Python exception, never std::terminate
      if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "fastops._C.call_signature: expected (x, params)");
    return nullptr;
  }
  PyObject* x_obj = args[0];
  PyObject* params = args[1];
  if (!THPVariable_Check(x_obj)) {
    Py_RETURN_NONE;
  }
  const at::Tensor& x = THPVariable_Unpack(x_obj);
  const bool grad_mode = c10::GradMode::is_enabled();
  bool differentiated = grad_mode && x.requires_grad();
  if (grad_mode && !differentiated && params != Py_None) {
    if (!PyTuple_Check(params)) {
      PyErr_SetString(PyExc_TypeError, "fastops._C.call_signature: expected params to be a tuple or None");
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(params) && !differentiated; ++i) {
      PyObject* p = PyTuple_GET_ITEM(params, i);
      differentiated = THPVariable_Check(p) && THPVariable_Unpack(p).requires_grad();
    }
  }
  uint64_t h = 0x6661737470730001ULL;
  mix(h, static_cast<uint64_t>(x.dim()));
  for (int64_t size : x.sizes()) mix(h, static_cast<uint64_t>(size));
  for (int64_t stride : x.strides()) mix(h, static_cast<uint64_t>(stride));
  mix(h, static_cast<uint64_t>(x.scalar_type()));
  const c10::Device device = x.device();
  const c10::DeviceType device_type = device.type();
  mix(h, (static_cast<uint64_t>(device_type) << 8) | static_cast<uint8_t>(device.index()));
  mix(h, (differentiated ? 1 : 0) | (grad_mode ? 2 : 0));
  if (device_type == c10::DeviceType::CPU) mix(h, static_cast<uint64_t>(at::get_num_threads()));
  // Only device types with an autocast mode: asking about another (meta) throws.
  if (at::autocast::is_autocast_available(device_type) && at::autocast::is_autocast_enabled(device_type)) {
    mix(h, 0x100 | static_cast<uint64_t>(at::autocast::get_autocast_dtype(device_type)));
  }
  mix(h, at::globalContext().deterministicAlgorithms() ? 1 : 0);
  return PyLong_FromUnsignedLongLong(h);
  END_HANDLE_TH_ERRORS
}

// cached_choice(module, x, counts): the whole per-call decision of a module that has decided on this
// kind of input before, in one call (~0.1 us against ~0.7 us for the same steps in Python): True
// (PyTorch's kernel; counts[op] += 1), False (ours), or None when Python must decide: a backend
// other than "auto", FASTOPS_BACKEND set to anything but auto, a torch.func transform active, no
// memo yet, or a kind of input the module has not seen (fastops/policy.py, fastops/tuner.py).
PyObject* cached_choice(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "fastops._C.cached_choice: expected (module, x, counts)");
    return nullptr;
  }
  PyObject* module = args[0];
  static PyObject* backend_name = PyUnicode_InternFromString("backend");
  static PyObject* state_name = PyUnicode_InternFromString("_fastops_tuning");
  static PyObject* memo_name = PyUnicode_InternFromString("memo");
  static PyObject* params_name = PyUnicode_InternFromString("params");
  static PyObject* op_name = PyUnicode_InternFromString("op");
  PyObject* backend = PyObject_GetAttr(module, backend_name);
  if (backend == nullptr) return nullptr;
  const bool is_auto = PyUnicode_Check(backend) && PyUnicode_CompareWithASCIIString(backend, "auto") == 0;
  Py_DECREF(backend);
  const char* env = std::getenv("FASTOPS_BACKEND");
  if (!is_auto || (env != nullptr && std::strcmp(env, "auto") != 0)) Py_RETURN_NONE;
  // Under torch.func transforms the modules run PyTorch's composition (fastops/policy.py); functorch
  // includes its front-mode key in the thread's dispatch keys while a transform is active.
  if (c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode)) Py_RETURN_NONE;
  PyObject* dict = PyObject_GenericGetDict(module, nullptr);
  if (dict == nullptr) return nullptr;
  PyObject* state = PyDict_GetItemWithError(dict, state_name);  // borrowed
  Py_XINCREF(state);
  Py_DECREF(dict);
  if (state == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  PyObject* memo = PyObject_GetAttr(state, memo_name);
  PyObject* params = memo != nullptr ? PyObject_GetAttr(state, params_name) : nullptr;
  PyObject* result = nullptr;
  if (params != nullptr) {
    PyObject* call_args[2] = {args[1], params};
    PyObject* key = call_signature(nullptr, call_args, 2);
    if (key == nullptr) {
      // the exception propagates
    } else if (key == Py_None || !PyDict_Check(memo)) {
      result = Py_NewRef(Py_None);
    } else {
      result = PyDict_GetItemWithError(memo, key);  // borrowed
      if (result == nullptr && !PyErr_Occurred()) result = Py_None;
      Py_XINCREF(result);
    }
    Py_XDECREF(key);
  }
  if (result == Py_True && PyDict_Check(args[2])) {  // counts[op] += 1
    PyObject* op = PyObject_GetAttr(state, op_name);
    PyObject* count = op != nullptr ? PyDict_GetItemWithError(args[2], op) : nullptr;
    long value = count != nullptr ? PyLong_AsLong(count) : 0;
    PyObject* incremented = op != nullptr ? PyLong_FromLong(value + 1) : nullptr;
    if (incremented == nullptr || PyDict_SetItem(args[2], op, incremented) < 0) Py_CLEAR(result);
    Py_XDECREF(incremented);
    Py_XDECREF(op);
  }
  Py_XDECREF(params);
  Py_XDECREF(memo);
  Py_DECREF(state);
  return result;
  END_HANDLE_TH_ERRORS
}

}  // namespace

// The Python functions of the fastops._C module (registration.cpp's module definition).
PyMethodDef python_methods[] = {
    {"call_signature", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_signature)), METH_FASTCALL,
     "A 64-bit key of what decides a fastops module's kernel choice for input x."},
    {"cached_choice", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cached_choice)), METH_FASTCALL,
     "A fastops module's remembered kernel choice for x: True (PyTorch's), False, or None."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace fastops
