// The typed dispatcher handle of a registered op, for C++ that calls another op through the dispatcher
// (csrc/<op>_op.cpp) so that each device's kernel runs. Callers keep the
// handle in a function-local static: the schema is looked up once.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace fastops {

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// A file's table of handles (a struct whose members are find_op calls), looked up on first use:
// handles<Ops>().gelu. Each file's table is its own type, in an anonymous namespace; a table two
// files share lives in a header (depthwise_ops.h).
template <typename Table>
const Table& handles() {
  static const Table table;
  return table;
}

}  // namespace fastops
