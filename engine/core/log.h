// Engine logging: one callback, set by the host (the GStreamer plugin points it at
// gst_debug_log under the "latent-engine" category; latent-tool prints to stderr).
#pragma once

#include <optional>
#include <string>

#include "engine/core/status.h"

namespace latent {

enum class LogLevel { kError = 1, kWarning = 2, kInfo = 4, kDebug = 5, kTrace = 6 };

using LogCallback = void (*)(LogLevel level, const char* file, int line, const char* message,
                             void* user_data);

// Installs the callback (nullptr restores the default: warnings and errors to stderr).
void set_log_callback(LogCallback cb, void* user_data);
// Messages above this level are dropped before formatting (default kWarning, or LATENT_LOG=N
// or a level's name: error, warning, info, debug, trace, none).
void set_log_level(LogLevel level);
// LATENT_LOG's value: a GStreamer-style number (0 none, 1 error, 2 warning, 4 info, 5 debug,
// 6 trace; up to 9) or one of those names (any case; `warn` too); nullopt for anything else.
std::optional<int> parse_log_level(const char* value);
bool log_enabled(LogLevel level);
void log_message(LogLevel level, const char* file, int line, const std::string& message);

}  // namespace latent

#define LATENT_LOG(level, ...)                                                      \
  do {                                                                              \
    if (::latent::log_enabled(level))                                               \
      ::latent::log_message(level, __FILE__, __LINE__, ::latent::str_cat(__VA_ARGS__)); \
  } while (0)
#define LATENT_ERROR(...) LATENT_LOG(::latent::LogLevel::kError, __VA_ARGS__)
#define LATENT_WARN(...) LATENT_LOG(::latent::LogLevel::kWarning, __VA_ARGS__)
#define LATENT_INFO(...) LATENT_LOG(::latent::LogLevel::kInfo, __VA_ARGS__)
#define LATENT_DEBUG(...) LATENT_LOG(::latent::LogLevel::kDebug, __VA_ARGS__)
