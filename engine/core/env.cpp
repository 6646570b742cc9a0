#include "engine/core/env.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "engine/core/log.h"

namespace latent {

int env_choice(const char* name, std::initializer_list<EnvSpellings> choices, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  int i = 0;
  for (const EnvSpellings& spellings : choices) {
    for (const char* s : spellings)
      if (std::strcmp(v, s) == 0) return i;
    ++i;
  }
  static std::mutex mutex;
  static std::set<std::pair<std::string, std::string>> warned;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!warned.emplace(name, v).second) return fallback;  // said already
  }
  std::string names, fallback_name;
  i = 0;
  for (const EnvSpellings& spellings : choices) {
    const char* first = spellings.size() ? *spellings.begin() : "";
    names += (names.empty() ? "" : ", ") + std::string(first);
    if (i++ == fallback) fallback_name = first;
  }
  LATENT_WARN(name, "=", v, " is not one of ", names, ": using ", fallback_name);
  return fallback;
}

}  // namespace latent
