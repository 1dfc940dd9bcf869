// Small constructors of guards shared by the guards/ tests.
#ifndef WARDEN_TESTS_GUARDS_GUARD_TEST_UTIL_H_
#define WARDEN_TESTS_GUARDS_GUARD_TEST_UTIL_H_

#include <vector>

#include <ATen/core/ivalue.h>

#include "guards/guard.h"

namespace warden::guards {

using Args = std::vector<c10::IValue>;

inline Guard Make(GuardKind kind, int arg = -1, int64_t expected = 0, int dim = -1,
                  int other_arg = -1) {
  Guard g{kind};
  g.arg = arg;
  g.dim = dim;
  g.other_arg = other_arg;
  g.expected = expected;
  return g;
}

inline Guard DoubleGuard(int arg, double expected) {
  Guard g = Make(GuardKind::kDoubleValue, arg);
  g.expected_double = expected;
  return g;
}

}  // namespace warden::guards

#endif  // WARDEN_TESTS_GUARDS_GUARD_TEST_UTIL_H_
