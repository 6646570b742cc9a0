#include "engine/core/plan_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "engine/core/log.h"

namespace latent {
namespace {

constexpr const char* kFormat = "gst-latent-plan-cache";
constexpr int kVersion = 1;
constexpr const char* kBlobMagic = "gst-latent-blob 1\n";

using Json = nlohmann::json;

// FNV-1a, 64 bits: stable across runs and builds (std::hash is not).
uint64_t fnv1a_bytes(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t fnv1a(const std::string& s) {
  return fnv1a_bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// mkdir -p; true when the folder exists afterwards.
bool make_dirs(const std::string& dir) {
  if (dir.empty()) return false;
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  const size_t slash = dir.find_last_of('/');
  if (slash != std::string::npos && slash > 0) make_dirs(dir.substr(0, slash));
  return mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST;
}

bool read_file(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *text = ss.str();
  return !in.bad();
}

// Writes `bytes` to a temporary file next to `path` and renames it over `path` (atomic on POSIX):
// a reader sees the old file or the new one, never a part.
Status write_atomically(const std::string& path, const std::string& bytes) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = str_cat(path, ".tmp.", static_cast<long>(getpid()), ".", counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Status::errorf("plan cache: cannot write ", tmp, ": ", std::strerror(errno));
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return Status::errorf("plan cache: writing ", tmp, " failed: ", std::strerror(errno));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return Status::errorf("plan cache: cannot rename ", tmp, " to ", path, ": ",
                          std::strerror(err));
  }
  return ok_status();
}

}  // namespace

std::string PlanCache::default_directory() {
  if (const char* v = std::getenv("LATENT_PLAN_CACHE")) {
    const std::string s = v;
    if (s.empty() || s == "0" || s == "off") return {};
    return s;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    return std::string(xdg) + "/gst-latent";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::string(home) + "/.cache/gst-latent";
  return {};
}

std::string PlanCache::file_for(const std::string& directory, const std::string& stem,
                                const Context& context) {
  if (directory.empty()) return {};
  const std::string canonical = Json(context).dump();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(canonical)));
  return directory + "/" + stem + "-" + hex + ".json";
}

PlanCache::PlanCache(std::string path, Context context)
    : path_(std::move(path)), context_(std::move(context)) {}

bool PlanCache::parse(const std::string& text, Json* entries, std::string* why) const {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    *why = "it is not valid JSON";
    return false;
  }
  if (!j.is_object() || j.value("format", std::string()) != kFormat) {
    *why = str_cat("it is not a ", kFormat, " file");
    return false;
  }
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<int>() != kVersion) {
    *why = str_cat("it has another format version (want ", kVersion, ")");
    return false;
  }
  if (!j.contains("context") || !j["context"].is_object() || j["context"] != Json(context_)) {
    *why = str_cat("it was made for another GPU or library version (",
                   j.contains("context") ? j["context"].dump() : std::string("no context"),
                   "; this process: ", Json(context_).dump(), ")");
    return false;
  }
  if (!j.contains("entries") || !j["entries"].is_object()) {
    *why = "it has no \"entries\" object";
    return false;
  }
  *entries = std::move(j["entries"]);
  return true;
}

size_t PlanCache::load() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (path_.empty()) return 0;
  std::string text;
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) return 0;  // no file yet
  if (!read_file(path_, &text)) {
    LATENT_WARN("plan cache ", path_, ": cannot be read (", std::strerror(errno),
                "); starting empty");
    return 0;
  }
  Json loaded;
  std::string why;
  if (!parse(text, &loaded, &why)) {
    LATENT_WARN("plan cache ", path_, ": ignored because ", why);
    return 0;
  }
  for (auto it = loaded.begin(); it != loaded.end(); ++it)
    if (!entries_.contains(it.key())) entries_[it.key()] = it.value();
  LATENT_DEBUG("plan cache ", path_, ": ", loaded.size(), " entries loaded");
  return loaded.size();
}

bool PlanCache::lookup(const std::string& key, Json* value) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  *value = *it;
  return true;
}

void PlanCache::put(const std::string& key, Json value) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it != entries_.end() && *it == value) return;
  entries_[key] = std::move(value);
  dirty_ = true;
}

bool PlanCache::dirty() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dirty_;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

Status PlanCache::save() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (path_.empty() || !dirty_) return ok_status();
  const size_t slash = path_.find_last_of('/');
  const std::string dir = slash == std::string::npos ? std::string(".") : path_.substr(0, slash);
  if (!make_dirs(dir))
    return Status::errorf("plan cache: cannot create the folder ", dir, ": ", std::strerror(errno));

  // Another process may have saved entries of the same context since we loaded: keep them
  // (ours win where both have a key).
  Json merged = entries_;
  std::string text;
  if (read_file(path_, &text)) {
    Json on_disk;
    std::string why;
    if (parse(text, &on_disk, &why))
      for (auto it = on_disk.begin(); it != on_disk.end(); ++it)
        if (!merged.contains(it.key())) merged[it.key()] = it.value();
  }

  Json file = {
      {"format", kFormat}, {"version", kVersion}, {"context", Json(context_)}, {"entries", merged}};
  LATENT_TRY(write_atomically(path_, file.dump(1) + '\n'));
  entries_ = std::move(merged);
  dirty_ = false;
  LATENT_DEBUG("plan cache ", path_, ": saved ", entries_.size(), " entries");
  return ok_status();
}

namespace {

void put_u64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64(const std::string& in, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

}  // namespace

std::string PlanCache::blob_path(const std::string& key) const {
  if (path_.empty()) return {};
  std::string stem = path_;
  if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".json") == 0)
    stem.resize(stem.size() - 5);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(key)));
  return str_cat(stem, ".blobs/", hex, ".bin");
}

// File layout: kBlobMagic, the key's length (8 bytes, little-endian) and bytes, the data's length
// and bytes, FNV-1a 64 of the data.
bool PlanCache::read_blob(const std::string& key, std::vector<uint8_t>* data) const {
  const std::string path = blob_path(key);
  if (path.empty()) return false;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;  // none yet
  std::string text;
  if (!read_file(path, &text)) {
    LATENT_WARN("plan cache blob ", path, ": cannot be read (", std::strerror(errno), ")");
    return false;
  }
  const size_t magic = std::strlen(kBlobMagic);
  auto damaged = [&](const char* why) {
    LATENT_WARN("plan cache blob ", path, ": ignored because ", why);
    return false;
  };
  if (text.size() < magic + 8 || text.compare(0, magic, kBlobMagic) != 0)
    return damaged("it is not a gst-latent blob");
  const uint64_t key_len = get_u64(text, magic);
  if (key_len > text.size() - magic - 8) return damaged("it is truncated (in its key)");
  const size_t data_at = magic + 8 + static_cast<size_t>(key_len);
  if (text.compare(magic + 8, static_cast<size_t>(key_len), key) != 0 || key_len != key.size())
    return damaged(str_cat("it holds another key than '", key, "'").c_str());
  if (text.size() - data_at < 16) return damaged("it is truncated (in its length)");
  const uint64_t n = get_u64(text, data_at);
  if (n != text.size() - data_at - 16) return damaged("its length does not match its size");
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data() + data_at + 8);
  if (fnv1a_bytes(bytes, static_cast<size_t>(n)) !=
      get_u64(text, data_at + 8 + static_cast<size_t>(n)))
    return damaged("its checksum does not match");
  data->assign(bytes, bytes + n);
  return true;
}

Status PlanCache::write_blob(const std::string& key, const std::vector<uint8_t>& data) const {
  const std::string path = blob_path(key);
  if (path.empty()) return ok_status();
  const std::string dir = path.substr(0, path.find_last_of('/'));
  if (!make_dirs(dir))
    return Status::errorf("plan cache: cannot create the folder ", dir, ": ", std::strerror(errno));
  std::string text = kBlobMagic;
  put_u64(&text, key.size());
  text += key;
  put_u64(&text, data.size());
  text.append(reinterpret_cast<const char*>(data.data()), data.size());
  put_u64(&text, fnv1a_bytes(data.data(), data.size()));
  return write_atomically(path, text);
}

}  // namespace latent
