// A small keyed JSON store for tuning results that are expensive to find and cheap to reuse
// (the CUDA backend's cuDNN convolution algorithm choices), persisted between processes.
//
// One file holds the entries of one *context*: the facts that make a result valid (GPU name,
// compute capability, library versions, ...). The file name carries a hash of the context, so
// two GPUs or two cuDNN versions on one machine keep separate files, and the context is stored
// inside and checked on load: a file whose context differs, or that does not parse, is ignored
// with a warning (and replaced at the next save). Entries are plain JSON values under string
// keys that the user of the store builds (op, dtype, shapes, parameters).
//
//   {"format": "gst-latent-plan-cache", "version": 1,
//    "context": {"gpu": "NVIDIA H200", "compute_capability": "9.0", ...},
//    "entries": {"conv2d bf16 ...": {"algo": 1, ...}, ...}}
//
// Saving writes a temporary file next to the target and renames it over the target (atomic on
// POSIX), after merging in entries another process may have saved meanwhile. Thread-safe.
//
// Blobs: opaque bytes too large or binary for the JSON (a serialized cuDNN execution plan with
// its compiled kernel), one file each in a folder beside the store's file (<file minus .json>.
// blobs/<16 hex digits of a hash of the key>.bin), so they share its context. Each file starts
// with a header naming its key and ends with a checksum: a truncated or damaged file, or one of
// another key, is not served.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace latent {

class PlanCache {
 public:
  using Context = std::map<std::string, std::string>;

  // The folder plan files go to: $LATENT_PLAN_CACHE when set (empty, "0" or "off": none),
  // else $XDG_CACHE_HOME/gst-latent, else $HOME/.cache/gst-latent. Empty when caching on disk
  // is off or no folder can be named.
  static std::string default_directory();
  // `directory`/`stem`-<16 hex digits of a hash of `context`>.json
  static std::string file_for(const std::string& directory, const std::string& stem,
                              const Context& context);

  // A store for `path` (empty: in memory only, nothing is read or written).
  PlanCache(std::string path, Context context);
  ~PlanCache() = default;
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;

  // Reads the file. A missing file is an empty store; an unreadable, corrupt or foreign one
  // is logged as a warning and ignored. Returns the number of entries loaded.
  size_t load();
  // The entry under `key`, or nullptr (a copy, so the store may change meanwhile).
  bool lookup(const std::string& key, nlohmann::json* value) const;
  // Adds or replaces an entry; the store is dirty until the next successful save().
  void put(const std::string& key, nlohmann::json value);
  // Writes the file when entries were added since the last load or save (creating the folder
  // if needed). A failure is returned (and the store stays dirty); callers usually log it.
  Status save();

  bool dirty() const;
  size_t size() const;

  // The blob under `key` into *data: false when there is none (or no path), and, with a warning,
  // when its file is damaged or holds another key.
  bool read_blob(const std::string& key, std::vector<uint8_t>* data) const;
  // Writes the blob under `key` (a temporary file renamed over the target). Without a path:
  // nothing, ok.
  Status write_blob(const std::string& key, const std::vector<uint8_t>& data) const;
  // The file the blob under `key` lives in (empty without a path).
  std::string blob_path(const std::string& key) const;
  const std::string& path() const { return path_; }
  const Context& context() const { return context_; }

 private:
  // Parses `text` as a plan file of this context into `entries`; false (with `why`) if not.
  bool parse(const std::string& text, nlohmann::json* entries, std::string* why) const;

  std::string path_;
  Context context_;
  mutable std::mutex mutex_;
  nlohmann::json entries_ = nlohmann::json::object();
  bool dirty_ = false;
};

}  // namespace latent
