// RETURN_IF_ERROR / ASSIGN_OR_RETURN for absl::Status (Debian's Abseil 20220623 has no status
// macros). Only this header defines them; everything input-driven in Warden returns Status.
#ifndef WARDEN_TRACER_STATUS_H_
#define WARDEN_TRACER_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define WARDEN_CONCAT_INNER_(a, b) a##b
#define WARDEN_CONCAT_(a, b) WARDEN_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    const ::absl::Status _warden_status = (expr);  \
    if (!_warden_status.ok()) return _warden_status; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(WARDEN_CONCAT_(_warden_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()

#endif  // WARDEN_TRACER_STATUS_H_
