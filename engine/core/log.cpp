#include "engine/core/log.h"

#include <strings.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>

namespace latent {
namespace {

std::mutex g_mutex;
LogCallback g_callback = nullptr;
void* g_user_data = nullptr;

// LATENT_LOG unset: warnings and errors. A value parse_log_level() does not take is reported on
// stderr and leaves that default (`LATENT_LOG=info` once read as 0 and silenced the errors too).
int initial_level() {
  const int fallback = static_cast<int>(LogLevel::kWarning);
  const char* env = std::getenv("LATENT_LOG");
  if (!env || !*env) return fallback;
  if (const std::optional<int> level = parse_log_level(env)) return *level;
  std::fprintf(stderr,
               "latent WARN: LATENT_LOG=%s is not a level (0-9, or none, error, warning, info, "
               "debug, trace): logging warnings and errors\n",
               env);
  return fallback;
}

std::atomic<int> g_level{initial_level()};

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return "ERROR";
    case LogLevel::kWarning: return "WARN";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kTrace: return "TRACE";
  }
  return "?";
}

}  // namespace

std::optional<int> parse_log_level(const char* value) {
  if (!value) return std::nullopt;
  static const struct {
    const char* name;
    int level;
  } kNames[] = {{"none", 0}, {"error", 1}, {"warning", 2}, {"warn", 2},
                {"info", 4}, {"debug", 5}, {"trace", 6}};
  for (const auto& n : kNames)
    if (strcasecmp(value, n.name) == 0) return n.level;
  if (value[0] >= '0' && value[0] <= '9' && value[1] == '\0') return value[0] - '0';
  return std::nullopt;
}

void set_log_callback(LogCallback cb, void* user_data) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_callback = cb;
  g_user_data = user_data;
}

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }

bool log_enabled(LogLevel level) {
  // A callback decides for itself (GStreamer filters by its own debug threshold).
  return g_callback != nullptr || static_cast<int>(level) <= g_level.load();
}

void log_message(LogLevel level, const char* file, int line, const std::string& message) {
  LogCallback cb;
  void* ud;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    cb = g_callback;
    ud = g_user_data;
  }
  if (cb) {
    cb(level, file, line, message.c_str(), ud);
    return;
  }
  if (static_cast<int>(level) <= g_level.load())
    std::fprintf(stderr, "latent %s: %s\n", level_name(level), message.c_str());
}

}  // namespace latent
