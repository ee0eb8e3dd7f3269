// The typed errors of the ops' checks (fastops/checks.h: FASTOPS_CHECK_SHAPE, _DTYPE, _ARG).
//
// A check throws a torch::PyTorchError whose python_type() is a class fastops/ops/_validate.py
// registers at import (ShapeError, DtypeError, ArgumentError). PyTorch turns every C++ exception
// that reaches Python through one handler (CATCH_CORE_ERRORS in torch/csrc/Exceptions.h), which
// raises a PyTorchError as its python_type(): so the type survives torch.ops dispatch, our C++
// autograd, Python kernels on the way (autograd, autocast: their Python error goes back through
// C++ as a python_error and is restored as it was) and torch.compile'd graphs. A c10::Error could
// only become one of PyTorch's fixed types (RuntimeError, ValueError, TypeError, ...), not a class
// that is a ValueError and a RuntimeError at once, which is what code written against the Python
// functions and code written against PyTorch's own ops each catch.
//
// This file is the only one that includes Python's headers for it; .cu files call throw_error
// through its declaration in checks.h, so a check in a CUDA host function throws the same error.
#include <Python.h>
#include <fastops/checks.h>
#include <torch/csrc/Exceptions.h>

#include <string>

namespace fastops {
namespace {

// Registered Python classes by ErrorType (strong references, kept for the life of the process).
PyObject* python_types[3] = {nullptr, nullptr, nullptr};

class TypedError final : public torch::PyTorchError {
 public:
  TypedError(ErrorType type, const std::string& message) : type_(type) { msg = message; }

  PyObject* python_type() override {
    PyObject* registered = python_types[static_cast<int>(type_)];
    // Before registration (the library loaded without the fastops package): what TORCH_CHECK raises.
    return registered != nullptr ? registered : PyExc_RuntimeError;
  }

 private:
  ErrorType type_;
};

// fastops._C._register_error_types(shape_error, dtype_error, argument_error)
PyObject* register_error_types(PyObject* /*self*/, PyObject* args) {
  PyObject* types[3];
  if (!PyArg_ParseTuple(args, "O!O!O!:_register_error_types", &PyType_Type, &types[0], &PyType_Type, &types[1],
                        &PyType_Type, &types[2])) {
    return nullptr;
  }
  for (int i = 0; i < 3; ++i) {
    if (PyObject_IsSubclass(types[i], PyExc_Exception) != 1) {
      PyErr_SetString(PyExc_TypeError, "fastops._C._register_error_types: expected exception classes");
      return nullptr;
    }
  }
  for (int i = 0; i < 3; ++i) {
    Py_INCREF(types[i]);
    Py_XDECREF(python_types[i]);
    python_types[i] = types[i];
  }
  Py_RETURN_NONE;
}

}  // namespace

void throw_error(ErrorType type, const std::string& message) { throw TypedError(type, message); }

PyMethodDef error_methods[] = {
    {"_register_error_types", register_error_types, METH_VARARGS,
     "Register the Python classes of the ops' typed errors (ShapeError, DtypeError, ArgumentError)."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace fastops
