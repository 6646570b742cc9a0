// diffusers config.json access with messages that name the file and the key.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace latent {

class Config {
 public:
  Config() = default;
  Config(nlohmann::json j, std::string path) : json_(std::move(j)), path_(std::move(path)) {}
  // Reads and parses a JSON object from `path` (must be an object at top level).
  static Result<Config> load(const std::string& path);
  static Result<Config> parse(const std::string& text, const std::string& what);

  const nlohmann::json& json() const { return json_; }
  const std::string& path() const { return path_; }
  bool has(const std::string& key) const;
  std::string class_name() const;  // "_class_name" or ""

  // Absent keys give the default; present keys of the wrong type or out of range are errors
  // naming file and key ("config.json: 'block_out_channels' must be a list of positive ints").
  Result<int64_t> get_int(const std::string& key, int64_t def) const;
  Result<int64_t> require_int(const std::string& key) const;
  Result<double> get_float(const std::string& key, double def) const;
  Result<bool> get_bool(const std::string& key, bool def) const;
  Result<std::string> get_string(const std::string& key, const std::string& def) const;
  Result<std::vector<int64_t>> get_int_list(const std::string& key,
                                            const std::vector<int64_t>& def) const;
  Result<std::vector<double>> get_float_list(const std::string& key,
                                             const std::vector<double>& def) const;
  Result<std::vector<std::string>> get_string_list(const std::string& key,
                                                   const std::vector<std::string>& def) const;

 private:
  nlohmann::json json_ = nlohmann::json::object();
  std::string path_;
};

}  // namespace latent
