#include "engine/weights/config.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

namespace latent {

namespace {

using Json = nlohmann::json;

// "[json.exception.parse_error.101] parse error at line 3, column 7: ..." -> "parse error at ...".
std::string strip_json_exception_prefix(const std::string& what) {
  if (!what.empty() && what[0] == '[') {
    size_t close = what.find("] ");
    if (close != std::string::npos) return what.substr(close + 2);
  }
  return what;
}

std::string brief(const Json& v) {
  std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// A JSON number with an integral value inside int64 (4 and 4.0 are ints; 4.5, 1e30 are not).
bool integral_value(const Json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    // 2^63 is the first double past int64's range.
    if (!std::isfinite(d) || d != std::trunc(d) || d < -9223372036854775808.0 ||
        d >= 9223372036854775808.0)
      return false;
    *out = static_cast<int64_t>(d);
    return true;
  }
  return false;
}

}  // namespace

Result<Config> Config::load(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    return Status::errorf("cannot read ", path, ": it is a folder, not a config file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::errorf("cannot read ", path, ": ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::errorf("error reading ", path);
  return parse(ss.str(), path);
}

Result<Config> Config::parse(const std::string& text, const std::string& what) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    // Our own line:column from the byte offset, so the message reads like a compiler's.
    size_t byte = std::min<size_t>(e.byte, text.size());
    size_t line = 1, col = 1;
    for (size_t i = 0; i + 1 < byte; ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    std::string detail = strip_json_exception_prefix(e.what());
    // Drop nlohmann's own "parse error at line L, column C: " now that the prefix says it.
    if (detail.rfind("parse error", 0) == 0) {
      size_t colon = detail.find(": ");
      if (colon != std::string::npos) detail = detail.substr(colon + 2);
    }
    return Status::errorf(what, ":", line, ":", col, ": invalid JSON: ", detail);
  } catch (const Json::exception& e) {
    return Status::errorf(what, ": invalid JSON: ", strip_json_exception_prefix(e.what()));
  }
  if (!j.is_object())
    return Status::errorf(what, ": a config must be a JSON object, found ", j.type_name());
  return Config(std::move(j), what);
}

// null counts as absent: diffusers writes `"shift_factor": null` for "not set".
bool Config::has(const std::string& key) const {
  auto it = json_.find(key);
  return it != json_.end() && !it->is_null();
}

std::string Config::class_name() const {
  auto it = json_.find("_class_name");
  return (it != json_.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

namespace {

std::string where(const std::string& path) { return path.empty() ? "config" : path; }

const Json* lookup(const Json& j, const std::string& key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

Result<int64_t> Config::get_int(const std::string& key, int64_t def) const {
  const Json* v = lookup(json_, key);
  if (!v) return def;
  int64_t out = 0;
  if (!integral_value(*v, &out))
    return Status::errorf(where(path_), ": '", key, "' must be an int, found ", v->type_name(), " ",
                          brief(*v));
  return out;
}

Result<int64_t> Config::require_int(const std::string& key) const {
  if (!lookup(json_, key))
    return Status::errorf(where(path_), ": missing required key '", key, "' (an int)");
  return get_int(key, 0);
}

Result<double> Config::get_float(const std::string& key, double def) const {
  const Json* v = lookup(json_, key);
  if (!v) return def;
  if (!v->is_number())
    return Status::errorf(where(path_), ": '", key, "' must be a number, found ", v->type_name(),
                          " ", brief(*v));
  return v->get<double>();
}

Result<bool> Config::get_bool(const std::string& key, bool def) const {
  const Json* v = lookup(json_, key);
  if (!v) return def;
  if (!v->is_boolean())
    return Status::errorf(where(path_), ": '", key, "' must be true or false, found ",
                          v->type_name(), " ", brief(*v));
  return v->get<bool>();
}

Result<std::string> Config::get_string(const std::string& key, const std::string& def) const {
  const Json* v = lookup(json_, key);
  if (!v) return def;
  if (!v->is_string())
    return Status::errorf(where(path_), ": '", key, "' must be a string, found ", v->type_name(),
                          " ", brief(*v));
  return v->get<std::string>();
}

Result<std::vector<int64_t>> Config::get_int_list(const std::string& key,
                                                  const std::vector<int64_t>& def) const {
  const Json* v = lookup(json_, key);
  if (!v) return def;
  if (!v->is_array())
    return Status::errorf(where(path_), ": '", key, "' must be a list of ints, found ",
                          v->type_name(), " ", brief(*v));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v->size(); ++i) {
    int64_t x = 0;
    if (!integral_value((*v)[i], &x))
      return Status::errorf(where(path_), ": '", key, "' must be a list of ints; element ", i,
                            " is ", (*v)[i].type_name(), " ", brief((*v)[i]));
    out.push_back(x);
  }
  return out;
}

Result<std::vector<double>> Config::get_float_list(const std::string& key,
                                                   const std::vector<double>& def) const {
  const Json* v = lookup(json_, key);
  if (!v) return def;
  if (!v->is_array())
    return Status::errorf(where(path_), ": '", key, "' must be a list of numbers, found ",
                          v->type_name(), " ", brief(*v));
  std::vector<double> out;
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_number())
      return Status::errorf(where(path_), ": '", key, "' must be a list of numbers; element ", i,
                            " is ", (*v)[i].type_name(), " ", brief((*v)[i]));
    out.push_back((*v)[i].get<double>());
  }
  return out;
}

Result<std::vector<std::string>> Config::get_string_list(
    const std::string& key, const std::vector<std::string>& def) const {
  const Json* v = lookup(json_, key);
  if (!v) return def;
  if (!v->is_array())
    return Status::errorf(where(path_), ": '", key, "' must be a list of strings, found ",
                          v->type_name(), " ", brief(*v));
  std::vector<std::string> out;
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string())
      return Status::errorf(where(path_), ": '", key, "' must be a list of strings; element ", i,
                            " is ", (*v)[i].type_name(), " ", brief((*v)[i]));
    out.push_back((*v)[i].get<std::string>());
  }
  return out;
}

}  // namespace latent
