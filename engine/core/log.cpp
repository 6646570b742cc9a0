#include "engine/core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace latent {
namespace {

std::mutex g_mutex;
LogCallback g_callback = nullptr;
void* g_user_data = nullptr;

int initial_level() {
  const char* env = std::getenv("LATENT_LOG");
  if (env && *env) return std::atoi(env);
  return static_cast<int>(LogLevel::kWarning);
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
