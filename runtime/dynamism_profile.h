// Dynamism that survives a restart: kAuto's decisions (which dims of a function became dynamic),
// kept per function in the cache directory and applied from the first compile of a new process.
//
// Note [Dynamism profiles]
// Under Dynamic::kAuto a dim becomes dynamic on the recompile after its size changed, so every new
// process compiled each function at least twice (a static entry, then the dynamic one). When a
// compile makes dims dynamic, Warden writes them to <root>/profiles/<hash>.json, where <root> is
// $WARDEN_CACHE_DIR, else ~/.cache/warden (a private directory, Note [Private files]) and <hash>
// names the function: its Options::name, the type of the callable it wraps (a lambda's type is
// unique to the lambda; a function pointer's is only its signature) and its argument signature
// (per argument: tensor rank and dtype, or the scalar's type). The first compile of such a function,
// in any later process, makes those dims dynamic at once (like Dynamo's profile-guided dynamism),
// so a sweep over sizes compiles once. Sizes 0 and 1 still specialize (a sweep that starts at 1
// compiles the size-1 entry first, as in a cold process).
//   - A profile is only ever a hint that widens what is symbolic; guards and shape rules decide
//     soundness as for mark_dynamic (a dim a rule needs static stays static, with a note).
//   - A profile that cannot be read, is malformed, was written for another function (name or
//     signature differ) or names a dim the arguments do not have is ignored with a note (explain(),
//     stderr once); the next dynamic decision rewrites it.
//   - Verified read-size sets (Note [Verified size reads]) are not persisted: they belong to a
//     generalized graph, which needs two traces of the new process.
//   - WARDEN_DYNAMISM_PROFILES=0 turns reading and writing them off.
#ifndef WARDEN_RUNTIME_DYNAMISM_PROFILE_H_
#define WARDEN_RUNTIME_DYNAMISM_PROFILE_H_

#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>

namespace warden::runtime {

struct DynamismProfile {
  std::string path;                      // the file ("" when profiles are off or have no directory)
  std::set<std::pair<int, int>> dims;    // (arg, dim) dynamic from the start
  std::string note;                      // why a profile found there was ignored ("" otherwise)
};

// The profile of function `name` called with `args`: empty dims if there is none (or it was ignored).
// `function` identifies the callable (its type name).
DynamismProfile LoadDynamismProfile(const std::string& name, const std::string& function,
                                    const std::vector<c10::IValue>& args);

// Records `dims` as the function's dynamic dims. Failures (no directory, write errors) are silent:
// a profile is an optimization.
void SaveDynamismProfile(const std::string& name, const std::string& function, const std::vector<c10::IValue>& args,
                         const std::set<std::pair<int, int>>& dims);

}  // namespace warden::runtime

#endif  // WARDEN_RUNTIME_DYNAMISM_PROFILE_H_
