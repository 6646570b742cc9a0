// libFuzzer target: config.json parsing and every typed getter on every key it holds.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "engine/weights/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto cfg = latent::Config::parse(text, "fuzz/config.json");
  if (!cfg.ok()) {
    if (cfg.status().message().empty()) std::abort();
    return 0;
  }
  (void)cfg->class_name();
  for (auto it = cfg->json().begin(); it != cfg->json().end(); ++it) {
    const std::string& key = it.key();
    (void)cfg->has(key);
    (void)cfg->get_int(key, 0);
    (void)cfg->require_int(key);
    (void)cfg->get_float(key, 0.0);
    (void)cfg->get_bool(key, false);
    (void)cfg->get_string(key, "");
    (void)cfg->get_int_list(key, {});
    (void)cfg->get_float_list(key, {});
    (void)cfg->get_string_list(key, {});
    // A value that reads as an int must also read as a number.
    auto i = cfg->get_int(key, 0);
    if (i.ok() && cfg->has(key) && !cfg->get_float(key, 0.0).ok()) std::abort();
  }
  return 0;
}
