// Environment switches that take one of a few named values.
#pragma once

#include <initializer_list>

namespace latent {

// One choice of a switch: the values that select it, the first its name.
using EnvSpellings = std::initializer_list<const char*>;

// The index in `choices` of the choice that environment variable `name` spells; unset or empty:
// `fallback`. Any other value gives `fallback` too, after a warning that names the variable, the
// value and the choices (a mistyped setting is never taken silently). The warning is given once
// a process for each variable and value, so a switch read on every call may use it too.
int env_choice(const char* name, std::initializer_list<EnvSpellings> choices, int fallback);

}  // namespace latent
