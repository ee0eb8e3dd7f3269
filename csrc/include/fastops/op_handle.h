// The typed dispatcher handle of a registered op, for C++ that calls another op through the dispatcher
// (csrc/autograd.cpp, csrc/squeeze_excite_block.cpp) so that each device's kernel runs. Callers keep the
// handle in a function-local static: the schema is looked up once.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace fastops {

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

}  // namespace fastops
