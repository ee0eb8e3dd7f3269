// The tuned modules' per-call path in C (fastops/tuner.py, fastops/policy.py). A fastops module
// remembers, per kind of input, whether its fastops kernel or PyTorch's was measured faster; finding
// that entry, and running our kernel when it is the choice, must cost far less than the kernel call
// itself (a few microseconds for a small tensor).
//
// call_signature(x, params) hashes what decides the choice into a 64-bit int (~0.1 us; building the
// key in Python read eight tensor attributes, ~0.8 us): x's sizes, strides, dtype and device; whether
// autograd will differentiate the call (grad mode on and x, or one of the Tensors in the tuple
// params, requires grad); the CPU thread count; the autocast state of x's device type;
// deterministic mode. A collision could only make a module run the slower of two kernels that
// compute the same thing, never a wrong result. A non-Tensor x gives None (the op itself then names
// what it expected). cached_choice and the run_<op> functions below look the key up.
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/autocast_mode.h>
#include <Python.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <fastops/op_handle.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

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

// Which kernel a module's backend settings leave open: kAuto (the tuner's choice), kFastops (ours,
// forced by module.backend or FASTOPS_BACKEND), kPython (Python decides: backend "torch", a bad
// value to be named, a torch.func transform active); kError with a Python error set.
enum class Backend { kAuto, kFastops, kPython, kError };

Backend backend_of(PyObject* module) {
  static PyObject* backend_name = PyUnicode_InternFromString("backend");
  PyObject* backend = PyObject_GetAttr(module, backend_name);
  if (backend == nullptr) return Backend::kError;
  const bool is_str = PyUnicode_Check(backend);
  const bool is_auto = is_str && PyUnicode_CompareWithASCIIString(backend, "auto") == 0;
  const bool is_fastops = is_str && PyUnicode_CompareWithASCIIString(backend, "fastops") == 0;
  Py_DECREF(backend);
  // Under torch.func transforms the modules run PyTorch's composition (fastops/policy.py); functorch
  // includes its front-mode key in the thread's dispatch keys while a transform is active.
  if (c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode)) {
    return Backend::kPython;
  }
  if (is_fastops) return Backend::kFastops;
  if (!is_auto) return Backend::kPython;
  const char* env = std::getenv("FASTOPS_BACKEND");
  if (env == nullptr || std::strcmp(env, "auto") == 0) return Backend::kAuto;
  return std::strcmp(env, "fastops") == 0 ? Backend::kFastops : Backend::kPython;
}

// The module's remembered choice for x: a new reference to True (PyTorch's kernel), False (ours) or
// None when Python must decide: a backend other than "auto" (fastops/policy.py), FASTOPS_BACKEND
// set to anything but auto, a torch.func transform active, no memo yet, or a kind of input the
// module has not seen (fastops/tuner.py). With op_out, also a new reference to the memo's op name.
// nullptr with a Python error set.
PyObject* memo_choice(PyObject* module, PyObject* x, PyObject** op_out);

PyObject* remembered_choice(PyObject* module, PyObject* x, PyObject** op_out = nullptr) {
  const Backend backend = backend_of(module);
  if (backend == Backend::kError) return nullptr;
  if (backend != Backend::kAuto) Py_RETURN_NONE;
  return memo_choice(module, x, op_out);
}

// The memo's entry for x under backend "auto" (see remembered_choice).
PyObject* memo_choice(PyObject* module, PyObject* x, PyObject** op_out) {
  static PyObject* state_name = PyUnicode_InternFromString("_fastops_tuning");
  static PyObject* memo_name = PyUnicode_InternFromString("memo");
  static PyObject* params_name = PyUnicode_InternFromString("params");
  static PyObject* op_name = PyUnicode_InternFromString("op");
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
    PyObject* call_args[2] = {x, params};
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
  if (result != nullptr && op_out != nullptr) {
    *op_out = PyObject_GetAttr(state, op_name);
    if (*op_out == nullptr) Py_CLEAR(result);
  }
  Py_XDECREF(params);
  Py_XDECREF(memo);
  Py_DECREF(state);
  return result;
}

// cached_choice(module, x, counts): the whole per-call decision of a module that has decided on this
// kind of input before, in one call (~0.1 us against ~0.7 us for the same steps in Python): True
// (PyTorch's kernel; counts[op] += 1), False (ours), or None when Python must decide.
PyObject* cached_choice(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "fastops._C.cached_choice: expected (module, x, counts)");
    return nullptr;
  }
  PyObject* op = nullptr;
  PyObject* result = remembered_choice(args[0], args[1], &op);
  if (result == Py_True && PyDict_Check(args[2])) {  // counts[op] += 1
    PyObject* count = PyDict_GetItemWithError(args[2], op);
    long value = count != nullptr ? PyLong_AsLong(count) : 0;
    PyObject* incremented = PyErr_Occurred() ? nullptr : PyLong_FromLong(value + 1);
    if (incremented == nullptr || PyDict_SetItem(args[2], op, incremented) < 0) Py_CLEAR(result);
    Py_XDECREF(incremented);
  }
  Py_XDECREF(op);
  return result;
  END_HANDLE_TH_ERRORS
}

// ---- the tuned modules' fast path ------------------------------------------------------------------
// run_<op>(module, x, *op_args): the op's output when `module` runs its own kernel for x (its backend
// or FASTOPS_BACKEND says "fastops", or under "auto" it remembers ours as the faster), else None; the module's forward
// then takes the Python path (tuning, PyTorch's kernel, fastops' checked function with its named errors). A swapped
// module called again on a kind of input it has seen (every training step) thus costs one C call that finds the choice
// and calls the op through the dispatcher with typed arguments, in place of the Python decision and
// torch.ops' boxed call (its argument parsing against the schema). Arguments that do not fit the
// typed call (another type, a Tensor subclass or mode with __torch_function__, which torch.ops would
// honour) also give None.

using GeluSig = at::Tensor(const at::Tensor&, c10::string_view);
using BiasGeluSig = at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view);
using ClippedLogSig = at::Tensor(const at::Tensor&, double, bool);
using DepthwiseSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
                                at::IntArrayRef, at::IntArrayRef);

struct Ops {
  c10::TypedOperatorHandle<GeluSig> gelu = find_op<GeluSig>("fastops::gelu");
  c10::TypedOperatorHandle<BiasGeluSig> bias_gelu = find_op<BiasGeluSig>("fastops::bias_gelu");
  c10::TypedOperatorHandle<ClippedLogSig> clipped_log = find_op<ClippedLogSig>("fastops::clipped_log");
  c10::TypedOperatorHandle<DepthwiseSig> depthwise_conv2d = find_op<DepthwiseSig>("fastops::depthwise_conv2d");
};

// A Tensor the typed call may take as it is: a torch.Tensor or nn.Parameter, not a subclass, and no
// __torch_function__ mode active (torch.ops would have called its override first).
const at::Tensor* plain_tensor(PyObject* obj) {
  if (!THPVariable_CheckExact(obj) || at::impl::torch_function_mode_enabled()) return nullptr;
  return &THPVariable_Unpack(obj);
}

// A list or tuple of exactly N Python ints.
template <size_t N>
bool int_array(PyObject* obj, std::array<int64_t, N>& out) {
  if (!PyList_Check(obj) && !PyTuple_Check(obj)) return false;
  if (PySequence_Fast_GET_SIZE(obj) != static_cast<Py_ssize_t>(N)) return false;
  PyObject** items = PySequence_Fast_ITEMS(obj);
  for (size_t i = 0; i < N; ++i) {
    if (!PyLong_CheckExact(items[i])) return false;
    out[i] = PyLong_AsLongLong(items[i]);
    if (out[i] == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
  }
  return true;
}

// A str, viewed (valid while the caller holds the object); false for anything else.
bool string_arg(PyObject* obj, c10::string_view& out) {
  if (!PyUnicode_Check(obj)) return false;
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(obj, &size);
  if (data == nullptr) {
    PyErr_Clear();  // a str that cannot be UTF-8 (lone surrogates): the Python path names it
    return false;
  }
  out = c10::string_view(data, static_cast<size_t>(size));
  return true;
}

// The op runs without the GIL, as torch.ops runs it: other Python threads (data loading, logging)
// go on meanwhile. Restored on the way out, exception or not.
struct WithoutGil {
  PyThreadState* state = PyEval_SaveThread();
  WithoutGil() = default;
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;
  ~WithoutGil() { PyEval_RestoreThread(state); }
};

// 1 when the module runs ours for x (forced, or remembered as faster), 0 when Python decides (the
// caller returns None), -1 on an error.
int chose_ours(PyObject* module, PyObject* x) {
  switch (backend_of(module)) {
    case Backend::kError:
      return -1;
    case Backend::kFastops:
      return 1;
    case Backend::kPython:
      return 0;
    case Backend::kAuto:
      break;
  }
  PyObject* choice = memo_choice(module, x, nullptr);
  if (choice == nullptr) return -1;
  const int ours = choice == Py_False ? 1 : 0;
  Py_DECREF(choice);
  return ours;
}

template <typename Call>
PyObject* run_chosen(PyObject* module, PyObject* x, Call&& call) {
  const int ours = chose_ours(module, x);
  if (ours <= 0) {
    if (ours < 0) return nullptr;
    Py_RETURN_NONE;
  }
  at::Tensor out;
  {
    WithoutGil released;
    out = call();
  }
  return THPVariable_Wrap(std::move(out));
}

bool takes_args(const char* name, Py_ssize_t nargs, Py_ssize_t expected) {
  if (nargs == expected) return true;
  PyErr_Format(PyExc_TypeError, "fastops._C.%s: expected %zd arguments, got %zd", name, expected, nargs);
  return false;
}

// run_gelu(module, x, approximate); fp32/fp16/bf16 only (the module sends fp64 to fastops.gelu).
PyObject* run_gelu(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!takes_args("run_gelu", nargs, 3)) return nullptr;
  const at::Tensor* x = plain_tensor(args[1]);
  c10::string_view form;
  if (x == nullptr || !string_arg(args[2], form)) Py_RETURN_NONE;
  const auto dtype = x->scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) Py_RETURN_NONE;
  return run_chosen(args[0], args[1], [&] { return handles<Ops>().gelu.call(*x, form); });
  END_HANDLE_TH_ERRORS
}

// run_bias_gelu(module, x, bias, approximate); a bias of x's dtype (the module casts other ones).
PyObject* run_bias_gelu(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!takes_args("run_bias_gelu", nargs, 4)) return nullptr;
  const at::Tensor* x = plain_tensor(args[1]);
  const at::Tensor* bias = plain_tensor(args[2]);
  c10::string_view form;
  if (x == nullptr || bias == nullptr || !string_arg(args[3], form)) Py_RETURN_NONE;
  if (bias->scalar_type() != x->scalar_type()) Py_RETURN_NONE;
  return run_chosen(args[0], args[1], [&] { return handles<Ops>().bias_gelu.call(*x, *bias, form); });
  END_HANDLE_TH_ERRORS
}

// run_clipped_log(module, x, eps, straight_through).
PyObject* run_clipped_log(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!takes_args("run_clipped_log", nargs, 4)) return nullptr;
  const at::Tensor* x = plain_tensor(args[1]);
  if (x == nullptr || !PyFloat_CheckExact(args[2]) || !PyBool_Check(args[3])) Py_RETURN_NONE;
  const double eps = PyFloat_AS_DOUBLE(args[2]);
  const bool straight_through = args[3] == Py_True;
  return run_chosen(args[0], args[1], [&] { return handles<Ops>().clipped_log.call(*x, eps, straight_through); });
  END_HANDLE_TH_ERRORS
}

// run_depthwise_conv2d(module, x, weight, bias or None, stride[2], padding[4], dilation[2]).
PyObject* run_depthwise_conv2d(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (!takes_args("run_depthwise_conv2d", nargs, 7)) return nullptr;
  const at::Tensor* x = plain_tensor(args[1]);
  const at::Tensor* weight = plain_tensor(args[2]);
  const at::Tensor* bias = args[3] == Py_None ? nullptr : plain_tensor(args[3]);
  std::array<int64_t, 2> stride{};
  std::array<int64_t, 4> padding{};
  std::array<int64_t, 2> dilation{};
  if (x == nullptr || weight == nullptr || (bias == nullptr && args[3] != Py_None) || !int_array(args[4], stride) ||
      !int_array(args[5], padding) || !int_array(args[6], dilation)) {
    Py_RETURN_NONE;
  }
  const std::optional<at::Tensor> maybe_bias = bias == nullptr ? std::nullopt : std::optional<at::Tensor>(*bias);
  return run_chosen(args[0], args[1], [&] {
    return handles<Ops>().depthwise_conv2d.call(*x, *weight, maybe_bias, stride, padding, dilation);
  });
  END_HANDLE_TH_ERRORS
}

}  // namespace

// The Python functions of the fastops._C module (registration.cpp's module definition).
PyMethodDef python_methods[] = {
    {"call_signature", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_signature)), METH_FASTCALL,
     "A 64-bit key of what decides a fastops module's kernel choice for input x."},
    {"cached_choice", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&cached_choice)), METH_FASTCALL,
     "A fastops module's remembered kernel choice for x: True (PyTorch's), False, or None."},
    {"run_gelu", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&run_gelu)), METH_FASTCALL,
     "fastops.gelu's output when the module remembers its kernel as faster for x, else None."},
    {"run_bias_gelu", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&run_bias_gelu)), METH_FASTCALL,
     "fastops.bias_gelu's output when the module remembers its kernel as faster for x, else None."},
    {"run_clipped_log", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&run_clipped_log)), METH_FASTCALL,
     "fastops.clipped_log's output when the module remembers its kernel as faster for x, else None."},
    {"run_depthwise_conv2d", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&run_depthwise_conv2d)),
     METH_FASTCALL,
     "fastops.depthwise_conv2d's output when the module remembers its kernel as faster for x, else None."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace fastops
