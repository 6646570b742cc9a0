#include "engine/weights/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/core/log.h"

namespace latent {

namespace {

using json = nlohmann::json;

// A header this large is either corrupt or not a safetensors file; real ones are a few MB.
constexpr uint64_t kMaxHeaderBytes = 100u * 1000u * 1000u;
// A valid header nests three levels ({name: {shape: [...]}}); deeper input is rejected before
// it reaches the JSON parser.
constexpr int kMaxHeaderDepth = 16;

bool parse_supported_dtype(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kF32;
  else if (s == "BF16")
    *out = DType::kBF16;
  else if (s == "F16")
    *out = DType::kF16;
  else
    return false;
  return true;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
  }
  return "?";
}

// The FP8 dtypes read (decoded to fp32, fp8.h).
Fp8Format parse_fp8_dtype(const std::string& s) {
  if (s == "F8_E4M3") return Fp8Format::kE4M3;
  if (s == "F8_E5M2") return Fp8Format::kE5M2;
  return Fp8Format::kNone;
}

// Bits per element of the safetensors dtypes this engine does not read. A tensor of one
// of these is skipped when the file is opened (its byte range is still checked) and named as
// unsupported when it is asked for.
bool unsupported_dtype_bits(const std::string& s, uint64_t* bits) {
  static const std::map<std::string, uint64_t> sizes = {
      {"BOOL", 8}, {"U8", 8},      {"I8", 8},      {"U16", 16},    {"I16", 16},
      {"U32", 32}, {"I32", 32},    {"U64", 64},    {"I64", 64},    {"F64", 64},
      {"C64", 64}, {"F8_E8M0", 8}, {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"F4", 4}};
  auto it = sizes.find(s);
  if (it == sizes.end()) return false;
  *bits = it->second;
  return true;
}

// Checks JSON text before the parser sees it, without building anything: nesting deeper than
// kMaxHeaderDepth, raw control bytes (JSON allows none outside whitespace, so they mean binary
// data) and anything but trailing spaces after the top-level value. The last two name the real
// fault of a safetensors header whose length field runs into the tensor data, which the depth
// limit or the parser would otherwise report first as something else.
Status check_json_text(const char* p, size_t n, const std::string& what, const std::string& kind) {
  int depth = 0;
  bool in_string = false, escaped = false, opened = false;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", c);
      return Status::errorf(
          what, ": ", kind, " holds a binary byte (", hex, ") at byte ", i, " of its ", n, " bytes",
          kind == "safetensors header" ? ": the header length runs into the tensor data (the file "
                                         "is damaged or not a safetensors file)"
                                       : ": not a text file");
    }
    if (opened && depth == 0) {
      // After the top-level value: safetensors pads with spaces, text files end in newlines.
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
      return Status::errorf(
          what, ": ", kind, " goes on after its JSON value ends (at byte ", i, " of ", n, ")",
          kind == "safetensors header" ? ": the header length runs into the tensor data (the file "
                                         "is damaged or not a safetensors file)"
                                       : "");
    }
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      opened = true;
      if (++depth > kMaxHeaderDepth)
        return Status::errorf(what, ": ", kind, " nests deeper than ", kMaxHeaderDepth, " levels");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return ok_status();
}

// "[json.exception.parse_error.101] parse error at line 1, column 5: ..." -> "parse error at ...".
std::string strip_json_exception_prefix(const std::string& what) {
  if (!what.empty() && what[0] == '[') {
    size_t close = what.find("] ");
    if (close != std::string::npos) return what.substr(close + 2);
  }
  return what;
}

// Parses JSON text; duplicate keys directly inside the top-level object are errors (the
// parser would otherwise keep only the last), reported through `duplicate`.
Status parse_json_object(const char* text, size_t n, const std::string& what,
                         const std::string& kind, json* out) {
  LATENT_TRY(check_json_text(text, n, what, kind));
  std::set<std::string> keys;
  std::string duplicate;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  try {
    *out = json::parse(text, text + n, callback, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    return Status::errorf(what, ": ", kind,
                          " is not valid JSON: ", strip_json_exception_prefix(e.what()));
  }
  if (!out->is_object())
    return Status::errorf(what, ": ", kind, " must be a JSON object, found ", out->type_name());
  if (!duplicate.empty())
    return Status::errorf(what, ": ", kind, " names '", duplicate, "' more than once");
  return ok_status();
}

// A JSON number that is a non-negative integer representable as uint64.
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = static_cast<uint64_t>(s);
    return true;
  }
  return false;
}

std::string json_brief(const json& v) {
  std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

struct ParsedEntry {
  TensorRecord record;
  std::string dtype_string;
  bool supported = true;
};

// The whole header check; `entries` gets every tensor, supported or not.
Status parse_header_entries(const uint8_t* data, size_t size, const std::string& what,
                            std::vector<ParsedEntry>* entries,
                            std::map<std::string, std::string>* metadata, uint64_t* data_start) {
  if (size < 8)
    return Status::errorf(what, ": not a safetensors file: ", size,
                          " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > size - 8)
    return Status::errorf(what, ": not a safetensors file: header length ", header_len,
                          " is larger than the ", size - 8, " bytes after it");
  if (header_len >= kMaxHeaderBytes)
    return Status::errorf(what, ": safetensors header length ", header_len,
                          " is over the 100 MB limit");
  if (header_len == 0) return Status::errorf(what, ": safetensors header is empty");

  json header;
  LATENT_TRY(parse_json_object(reinterpret_cast<const char*>(data + 8), header_len, what,
                               "safetensors header", &header));

  const uint64_t data_bytes = size - 8 - header_len;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        return Status::errorf(what, ": __metadata__ must be an object of strings, found ",
                              v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return Status::errorf(what, ": __metadata__ entry '", m.key(),
                                "' must be a string, found ", m.value().type_name());
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto fail = [&](auto&&... args) {
      return Status::errorf("tensor '", name, "' in ", what, ": ", args...);
    };
    if (!v.is_object()) return fail("entry must be an object, found ", v.type_name());
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return fail("'dtype' must be a string");
    if (sh == v.end() || !sh->is_array()) return fail("'shape' must be a list of ints");
    if (off == v.end() || !off->is_array() || off->size() != 2)
      return fail("'data_offsets' must be a list [begin, end]");

    ParsedEntry e;
    e.record.name = name;
    e.dtype_string = dt->get<std::string>();
    uint64_t elem_bits = 0;
    if (parse_supported_dtype(e.dtype_string, &e.record.dtype)) {
      elem_bits = dtype_size(e.record.dtype) * 8;
    } else if ((e.record.fp8 = parse_fp8_dtype(e.dtype_string)) != Fp8Format::kNone) {
      e.record.dtype = DType::kF32;
      elem_bits = 8;
    } else if (unsupported_dtype_bits(e.dtype_string, &elem_bits)) {
      e.supported = false;
    } else {
      return fail("unknown dtype '", e.dtype_string, "'");
    }

    uint64_t numel = 1;
    for (size_t d = 0; d < sh->size(); ++d) {
      uint64_t dim = 0;
      if (!as_u64((*sh)[d], &dim) || dim > static_cast<uint64_t>(INT64_MAX))
        return fail("shape entry ", d, " must be a non-negative int, found ", json_brief((*sh)[d]));
      e.record.shape.push_back(static_cast<int64_t>(dim));
      if (__builtin_mul_overflow(numel, dim, &numel) || numel > static_cast<uint64_t>(INT64_MAX))
        return fail("shape ", json_brief(*sh), " has too many elements");
    }
    uint64_t bits = 0;
    if (__builtin_mul_overflow(numel, elem_bits, &bits))
      return fail("shape ", shape_str(e.record.shape), " is too large");
    const uint64_t expected_bytes = bits / 8 + (bits % 8 ? 1 : 0);

    if (!as_u64((*off)[0], &e.record.begin) || !as_u64((*off)[1], &e.record.end))
      return fail("'data_offsets' must be non-negative ints, found ", json_brief(*off));
    if (e.record.begin > e.record.end)
      return fail("data_offsets [", e.record.begin, ", ", e.record.end, "] end before they begin");
    if (e.record.end > data_bytes)
      return fail("data_offsets [", e.record.begin, ", ", e.record.end,
                  "] reach past the end of the ", data_bytes, "-byte data block");
    if (e.record.end - e.record.begin != expected_bytes)
      return fail("data_offsets [", e.record.begin, ", ", e.record.end, "] hold ",
                  e.record.end - e.record.begin, " bytes but ", e.dtype_string,
                  shape_str(e.record.shape), " needs ", expected_bytes);
    entries->push_back(std::move(e));
  }

  // No two tensors may share bytes (empty tensors occupy nothing).
  std::vector<const ParsedEntry*> by_offset;
  for (const auto& e : *entries)
    if (e.record.end > e.record.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const ParsedEntry* a, const ParsedEntry* b) {
    return a->record.begin < b->record.begin;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorRecord& a = by_offset[i - 1]->record;
    const TensorRecord& b = by_offset[i]->record;
    if (b.begin < a.end)
      return Status::errorf(what, ": tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '",
                            b.name, "' [", b.begin, ", ", b.end, ") overlap");
  }
  if (data_start) *data_start = 8 + header_len;
  return ok_status();
}

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

Status parse_safetensors_header(const uint8_t* data, size_t size, const std::string& what,
                                std::vector<TensorRecord>* records,
                                std::map<std::string, std::string>* metadata,
                                uint64_t* data_start) {
  std::vector<ParsedEntry> entries;
  std::map<std::string, std::string> meta;
  uint64_t start = 0;
  LATENT_TRY(parse_header_entries(data, size, what, &entries, &meta, &start));
  if (records) {
    records->clear();
    for (auto& e : entries)
      if (e.supported) records->push_back(std::move(e.record));
  }
  if (metadata) *metadata = std::move(meta);
  if (data_start) *data_start = start;
  return ok_status();
}

// --- SafetensorsFile ----------------------------------------------------------------------

Result<std::shared_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::errorf("cannot open ", path, ": ", errno_text(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return Status::errorf("cannot stat ", path, ": ", errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::errorf(path, ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Status::errorf(path, ": not a safetensors file: ", size,
                          " bytes, shorter than the 8-byte header length");
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (base == MAP_FAILED) return Status::errorf("cannot map ", path, ": ", errno_text(map_err));

  auto file = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ =
      std::make_shared<Storage>(base, size, Device{}, [size](void* p) { ::munmap(p, size); });

  std::vector<ParsedEntry> entries;
  LATENT_TRY(parse_header_entries(static_cast<const uint8_t*>(base), size, path, &entries,
                                  &file->metadata_, &file->data_start_));
  size_t skipped = 0;
  for (auto& e : entries) {
    if (!e.supported) {
      if (skipped++ == 0)
        LATENT_DEBUG(path, ": skipping tensor '", e.record.name, "' of unsupported dtype ",
                     e.dtype_string);
      continue;
    }
    file->index_[e.record.name] = file->records_.size();
    file->records_.push_back(std::move(e.record));
  }
  if (skipped > 1) LATENT_DEBUG(path, ": skipped ", skipped, " tensors of unsupported dtypes");
  LATENT_DEBUG(path, ": ", file->records_.size(), " tensors, ", size, " bytes mapped");
  return file;
}

const TensorRecord* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &records_[it->second];
}

Result<Tensor> SafetensorsFile::tensor(const std::string& name) const {
  const TensorRecord* r = find(name);
  if (!r) {
    // Tell "not there" apart from "there in a dtype we skipped" (only on this error path, so
    // re-reading the header costs nothing in a successful load).
    std::vector<ParsedEntry> entries;
    if (parse_header_entries(static_cast<const uint8_t*>(mapping_->data()), mapping_->bytes(),
                             path_, &entries, nullptr, nullptr)
            .ok()) {
      for (const auto& e : entries)
        if (e.record.name == name && !e.supported)
          return Status::errorf("unsupported dtype ", e.dtype_string, " for tensor '", name,
                                "' in ", path_,
                                " (only F32, BF16, F16, F8_E4M3 and F8_E5M2 are supported)");
    }
    return Status::errorf("no tensor '", name, "' in ", path_);
  }
  const size_t offset = static_cast<size_t>(data_start_ + r->begin);
  if (r->fp8 != Fp8Format::kNone) {
    Tensor t = Tensor::empty(r->shape, DType::kF32);
    fp8_decode(r->fp8, static_cast<const uint8_t*>(mapping_->data()) + offset, t.data_as<float>(),
               static_cast<size_t>(t.numel()));
    return t;
  }
  if (offset % dtype_size(r->dtype) != 0) {
    // Misaligned for its element type (a header length that is not a multiple of 8): copy
    // rather than hand out a view that typed loads would read unaligned.
    Tensor t = Tensor::empty(r->shape, r->dtype);
    std::memcpy(t.data(), static_cast<const char*>(mapping_->data()) + offset, t.nbytes());
    return t;
  }
  return Tensor::from_storage(mapping_, offset, r->shape, r->dtype);
}

// --- writing ------------------------------------------------------------------------------

Status write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      return Status::errorf("writing ", path, ": '__metadata__' cannot name a tensor");
    if (!t.defined()) return Status::errorf("writing ", path, ": tensor '", name, "' is undefined");
    if (!t.device().is_cpu())
      return Status::errorf("writing ", path, ": tensor '", name, "' is on ",
                            t.device().to_string(), ", not the host");
    if (t.layout() != Layout::kContiguous)
      return Status::errorf("writing ", path, ": tensor '", name,
                            "' is in a backend layout; download it first");
    const uint64_t n = t.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string text = header.dump(-1, ' ', false, json::error_handler_t::strict);
  while (text.size() % 8 != 0) text.push_back(' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  // Write beside the target and rename, so a failed write never leaves a half file at `path`.
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Status::errorf("cannot create ", tmp, ": ", errno_text(errno));
  bool good =
      std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto& [name, t] : tensors) {
    if (!good) break;
    good = std::fwrite(t.data(), 1, t.nbytes(), f) == t.nbytes();
  }
  int err = errno;
  if (std::fclose(f) != 0 && good) {
    good = false;
    err = errno;
  }
  if (!good) {
    std::remove(tmp.c_str());
    return Status::errorf("writing ", path, ": ", errno_text(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    std::remove(tmp.c_str());
    return Status::errorf("cannot rename ", tmp, " to ", path, ": ", errno_text(err));
  }
  return ok_status();
}

// --- SafetensorsStreamWriter --------------------------------------------------------------

namespace {

// pwrite of all `n` bytes (short writes and EINTR retried); errno is left set on failure.
bool pwrite_all(int fd, const void* data, size_t n, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (w == 0) {
      errno = EIO;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return true;
}

bool pread_all(int fd, void* data, size_t n, uint64_t offset) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (r == 0) {
      errno = EIO;  // the file is shorter than what was written to it
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

// Moves `n` bytes inside the file from `from` to `to` (overlapping ranges allowed).
bool move_range(int fd, uint64_t from, uint64_t to, uint64_t n) {
  if (from == to || n == 0) return true;
  constexpr uint64_t kChunk = 4u << 20;
  std::vector<char> buf(static_cast<size_t>(std::min(kChunk, n)));
  if (to < from) {  // forward walk
    for (uint64_t done = 0; done < n;) {
      const uint64_t k = std::min<uint64_t>(buf.size(), n - done);
      if (!pread_all(fd, buf.data(), k, from + done) || !pwrite_all(fd, buf.data(), k, to + done))
        return false;
      done += k;
    }
  } else {  // backward walk: the destination overlaps the source's tail
    for (uint64_t left = n; left > 0;) {
      const uint64_t k = std::min<uint64_t>(buf.size(), left);
      left -= k;
      if (!pread_all(fd, buf.data(), k, from + left) || !pwrite_all(fd, buf.data(), k, to + left))
        return false;
    }
  }
  return true;
}

std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace

Result<std::unique_ptr<SafetensorsStreamWriter>> SafetensorsStreamWriter::create(
    const std::string& path, const std::string& tensor_name, DType dtype, const Shape& frame_shape,
    const Options& options) {
  if (path.empty()) return Status::error("writing a safetensors file: no path given");
  if (tensor_name.empty() || tensor_name == "__metadata__")
    return Status::errorf("writing ", path, ": invalid tensor name '", tensor_name, "'");
  if (options.header_reserve < 16 || options.header_reserve % 8 != 0)
    return Status::errorf("writing ", path, ": header reserve ", options.header_reserve,
                          " is not a multiple of 8 of at least 16");
  int64_t numel = 1;
  for (int64_t d : frame_shape) {
    if (d <= 0 || d > (int64_t(1) << 32))
      return Status::errorf("writing ", path, ": invalid frame shape ", shape_str(frame_shape));
    numel *= d;
    if (numel > (int64_t(1) << 40))
      return Status::errorf("writing ", path, ": frame shape ", shape_str(frame_shape),
                            " is too large");
  }
  std::unique_ptr<SafetensorsStreamWriter> w(new SafetensorsStreamWriter());
  w->path_ = path;
  w->partial_ = path + ".partial";
  w->tensor_name_ = tensor_name;
  w->dtype_ = dtype;
  w->frame_shape_ = frame_shape;
  w->frame_bytes_ = static_cast<size_t>(numel) * dtype_size(dtype);
  w->options_ = options;
  w->fd_ = ::open(w->partial_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return Status::errorf("cannot create ", w->partial_, ": ", errno_text(errno));
  return w;
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() { abort(); }

void SafetensorsStreamWriter::abort() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  ::unlink(partial_.c_str());
}

Status SafetensorsStreamWriter::fail(Status status) {
  abort();
  return status;
}

Status SafetensorsStreamWriter::append(const void* data, size_t bytes) {
  if (fd_ < 0) return Status::errorf("writing ", path_, ": the file is already closed");
  if (bytes != frame_bytes_)
    return Status::errorf("writing ", path_, ": a frame of ", bytes, " bytes, expected ",
                          frame_bytes_, " (", shape_str(frame_shape_), " ", dtype_name(dtype_),
                          ")");
  const uint64_t at = options_.header_reserve + static_cast<uint64_t>(frames_) * frame_bytes_;
  if (!pwrite_all(fd_, data, bytes, at)) {
    const int err = errno;
    return fail(Status::errorf("writing ", partial_, " (frame ", frames_, ", ", at + bytes,
                               " bytes in): ", errno_text(err)));
  }
  ++frames_;
  return ok_status();
}

Status SafetensorsStreamWriter::finish(const std::map<std::string, std::string>& metadata) {
  if (fd_ < 0) return Status::errorf("writing ", path_, ": the file is already closed");
  if (frames_ == 0) return fail(Status::errorf("writing ", path_, ": no frames were written"));
  const uint64_t data_bytes = static_cast<uint64_t>(frames_) * frame_bytes_;
  Shape shape;
  shape.push_back(frames_);
  shape.insert(shape.end(), frame_shape_.begin(), frame_shape_.end());
  json header = json::object();
  header[tensor_name_] = {{"dtype", safetensors_dtype_name(dtype_)},
                          {"shape", shape},
                          {"data_offsets", {uint64_t(0), data_bytes}}};
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const std::exception& e) {  // metadata that is not UTF-8
    return fail(Status::errorf("writing ", path_, ": invalid metadata: ", e.what()));
  }
  while (text.size() % 8 != 0) text.push_back(' ');
  const uint64_t exact = 8 + text.size();
  const uint64_t reserve = options_.header_reserve;
  uint64_t data_start = exact;
  if (exact <= reserve && (reserve - exact) * 16 <= data_bytes) {
    text.append(reserve - exact, ' ');  // pad: the data stays where it is
    data_start = reserve;
  } else if (!move_range(fd_, reserve, exact, data_bytes)) {
    const int err = errno;
    return fail(Status::errorf("writing ", partial_,
                               " (moving the data after the header): ", errno_text(err)));
  }
  if (::ftruncate(fd_, static_cast<off_t>(data_start + data_bytes)) != 0) {
    const int err = errno;
    return fail(Status::errorf("writing ", partial_, ": ", errno_text(err)));
  }
  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  if (!pwrite_all(fd_, len, 8, 0) || !pwrite_all(fd_, text.data(), text.size(), 8)) {
    const int err = errno;
    return fail(Status::errorf("writing the header of ", partial_, ": ", errno_text(err)));
  }
  if (options_.sync && ::fsync(fd_) != 0) {
    const int err = errno;
    return fail(Status::errorf("syncing ", partial_, ": ", errno_text(err)));
  }
  if (::close(fd_) != 0) {
    const int err = errno;
    fd_ = -1;
    ::unlink(partial_.c_str());
    return Status::errorf("closing ", partial_, ": ", errno_text(err));
  }
  fd_ = -1;
  if (std::rename(partial_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(partial_.c_str());
    return Status::errorf("cannot rename ", partial_, " to ", path_, ": ", errno_text(err));
  }
  if (options_.sync) {  // the rename itself is durable once the folder is synced
    int dir = ::open(parent_dir(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);
      ::close(dir);
    }
  }
  return ok_status();
}

// --- WeightStore --------------------------------------------------------------------------

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Status read_text_file(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::errorf("cannot read ", path, ": ", errno_text(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::errorf("error reading ", path);
  *out = ss.str();
  return ok_status();
}

}  // namespace

Result<WeightStore> WeightStore::open(const std::string& path) {
  WeightStore store;
  store.path_ = path;
  if (!ends_with(path, ".json")) {
    LATENT_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
    for (const auto& r : file->records()) store.owner_[r.name] = 0;
    store.files_.push_back(std::move(file));
    return store;
  }

  // A sharded checkpoint: {"metadata": {...}, "weight_map": {"tensor": "shard file"}}.
  std::string text;
  LATENT_TRY(read_text_file(path, &text));
  json index;
  LATENT_TRY(parse_json_object(text.data(), text.size(), path, "index", &index));
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object())
    return Status::errorf(path, ": index needs a \"weight_map\" object of tensor -> shard file");
  if (wm->empty()) return Status::errorf(path, ": \"weight_map\" is empty");

  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::map<std::string, size_t> shard_index;  // shard name as written -> files_ index
  std::map<std::string, std::string> listed;  // tensor -> shard name as written
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string() || it.value().get<std::string>().empty())
      return Status::errorf(path, ": weight_map entry '", it.key(),
                            "' must name a shard file, found ", json_brief(it.value()));
    const std::string shard = it.value().get<std::string>();
    listed[it.key()] = shard;
    if (shard_index.count(shard)) continue;
    const std::string shard_path = (dir / shard).string();
    std::error_code ec;
    if (!std::filesystem::exists(shard_path, ec))
      return Status::errorf(path, " names shard ", shard_path, " for tensor '", it.key(),
                            "', but that file does not exist");
    auto file = SafetensorsFile::open(shard_path);
    if (!file.ok()) return file.status().with_context(str_cat("shard of ", path));
    shard_index[shard] = store.files_.size();
    store.files_.push_back(std::move(file).value());
  }

  // Every tensor of every shard is reachable; a name in two shards is ambiguous.
  for (size_t i = 0; i < store.files_.size(); ++i) {
    for (const auto& r : store.files_[i]->records()) {
      auto [it, inserted] = store.owner_.emplace(r.name, i);
      if (!inserted)
        return Status::errorf("tensor '", r.name, "' is in both ", store.files_[it->second]->path(),
                              " and ", store.files_[i]->path(), " (index ", path, ")");
    }
  }
  size_t unlisted = store.owner_.size();
  for (const auto& [name, shard] : listed) {
    const size_t i = shard_index[shard];
    auto it = store.owner_.find(name);
    if (it == store.owner_.end() || it->second != i) {
      // Not there at all, or only in a shard the index did not name; maybe skipped for dtype.
      auto probe = store.files_[i]->tensor(name);
      std::string why = probe.ok() ? "" : probe.status().message();
      if (why.rfind("unsupported dtype", 0) == 0) {
        --unlisted;  // listed, merely not loadable: get() names the dtype
        continue;
      }
      return Status::errorf(path, " lists tensor '", name, "' in ", store.files_[i]->path(),
                            ", but that shard does not contain it");
    }
    --unlisted;
  }
  if (unlisted > 0)
    LATENT_DEBUG(path, ": ", unlisted, " tensors are in the shards but not in the weight_map");
  return store;
}

bool WeightStore::contains(const std::string& name) const { return owner_.count(name) != 0; }

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  out.reserve(owner_.size());
  for (const auto& [name, i] : owner_) out.push_back(name);
  return out;
}

const TensorRecord* WeightStore::find(const std::string& name) const {
  auto it = owner_.find(name);
  return it == owner_.end() ? nullptr : files_[it->second]->find(name);
}

namespace {

constexpr const char* kWeightScaleSuffixes[] = {".scale_weight", ".weight_scale"};
constexpr const char* kInputScaleSuffixes[] = {".scale_input", ".input_scale"};
constexpr char kScaledFp8Marker[] = "scaled_fp8";

std::string stored_dtype_name(const TensorRecord& r) {
  return r.fp8 != Fp8Format::kNone ? fp8_safetensors_name(r.fp8) : safetensors_dtype_name(r.dtype);
}

}  // namespace

Fp8Companion fp8_companion(const std::string& name) {
  Fp8Companion c;
  auto scale = [&](const char* const* suffixes, Fp8Companion::Kind kind) {
    for (int i = 0; i < 2; ++i) {
      const std::string suffix = suffixes[i];
      if (name.size() > suffix.size() && ends_with(name, suffix)) {
        c.kind = kind;
        c.weight = name.substr(0, name.size() - suffix.size()) + ".weight";
        return true;
      }
    }
    return false;
  };
  if (scale(kWeightScaleSuffixes, Fp8Companion::kWeightScale)) return c;
  if (scale(kInputScaleSuffixes, Fp8Companion::kInputScale)) return c;
  if (name == kScaledFp8Marker || ends_with(name, std::string(".") + kScaledFp8Marker))
    c.kind = Fp8Companion::kMarker;
  return c;
}

const TensorRecord* WeightStore::fp8_scale_of(const std::string& weight) const {
  if (!ends_with(weight, ".weight")) return nullptr;
  const std::string base = weight.substr(0, weight.size() - std::strlen(".weight"));
  for (const char* suffix : kWeightScaleSuffixes)
    if (const TensorRecord* r = find(base + suffix)) return r;
  return nullptr;
}

std::string WeightStore::check_fp8_companion(const std::string& name) const {
  const Fp8Companion c = fp8_companion(name);
  const TensorRecord* r = find(name);
  if (c.kind == Fp8Companion::kNone || !r) return "not an FP8 scale";
  const int64_t n = shape_numel(r->shape);
  if (c.kind == Fp8Companion::kMarker) {
    if (n > 2)
      return str_cat("tensor '", name, "' in ", path_, " has ", n,
                     " values: not ComfyUI's scaled_fp8 marker (at most 2)");
    return "";
  }
  const TensorRecord* w = find(c.weight);
  if (!w)
    return str_cat("tensor '", name, "' in ", path_, " is an FP8 scale, but there is no '",
                   c.weight, "' beside it");
  if (w->fp8 == Fp8Format::kNone)
    return str_cat("tensor '", name, "' in ", path_, " scales '", c.weight,
                   "', which is stored as ", stored_dtype_name(*w), ", not FP8");
  if (r->fp8 != Fp8Format::kNone)
    return str_cat("tensor '", name, "' in ", path_, " is an FP8 scale stored as ",
                   stored_dtype_name(*r), "; scales are F32, BF16 or F16");
  if (c.kind == Fp8Companion::kInputScale) {
    if (n != 1)
      return str_cat("tensor '", name, "' in ", path_, " has shape ", shape_str(r->shape),
                     ": an input scale holds one value");
    return "";
  }
  // One value, or one per output row ([R] or [R, 1] for a weight [R, ...]).
  const bool per_tensor = n == 1;
  const bool per_row = !w->shape.empty() && n == w->shape[0] && r->shape.size() >= 1 &&
                       r->shape.size() <= 2 && r->shape[0] == w->shape[0];
  if (!per_tensor && !per_row)
    return str_cat("tensor '", name, "' in ", path_, " has shape ", shape_str(r->shape),
                   ": a scale of '", c.weight, "' ", shape_str(w->shape),
                   " holds one value or one per row");
  return "";
}

Result<Tensor> WeightStore::get(const std::string& name) const {
  auto it = owner_.find(name);
  if (it != owner_.end()) {
    const TensorRecord* rec = files_[it->second]->find(name);
    const TensorRecord* scale = fp8_scale_of(name);
    if (!scale) return files_[it->second]->tensor(name);
    if (std::string why = check_fp8_companion(scale->name); !why.empty()) return Status::error(why);
    LATENT_ASSIGN_OR_RETURN(Tensor w, files_[it->second]->tensor(name));  // fp32, decoded
    LATENT_ASSIGN_OR_RETURN(Tensor s, get(scale->name));
    const std::vector<float> sv = s.to_floats();
    for (float v : sv)
      if (!std::isfinite(v))
        return Status::errorf("tensor '", scale->name, "' in ", path_, " holds ", v,
                              ": a weight scale must be finite");
    // weight [R, ...] x scale (one value, or one per row R)
    float* p = w.data_as<float>();
    const int64_t rows = sv.size() == 1 ? 1 : rec->shape[0];
    const int64_t per_row = w.numel() / std::max<int64_t>(rows, 1);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < per_row; ++i) p[r * per_row + i] *= sv[static_cast<size_t>(r)];
    return w;
  }
  for (const auto& f : files_) {
    auto probe = f->tensor(name);
    if (!probe.ok() && probe.status().message().rfind("unsupported dtype", 0) == 0)
      return probe.status();
  }
  return Status::errorf("no tensor '", name, "' in ", path_);
}

}  // namespace latent
