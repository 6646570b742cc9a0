// Safetensors reading: the header is parsed into records checked against the file size, the
// file is memory-mapped and tensors are zero-copy views that keep the mapping alive.
// Format: 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data block; offsets are relative to the data block.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/weights/fp8.h"

namespace latent {

struct TensorRecord {
  std::string name;
  DType dtype = DType::kF32;  // what tensor() returns: fp32 for an FP8 tensor
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data block
  uint64_t end = 0;
  Fp8Format fp8 = Fp8Format::kNone;  // stored as F8_E4M3 / F8_E5M2 (fp8.h), decoded on read
};

// Parses and validates a whole safetensors image held in memory (used by the file loader and
// the fuzzer): header length, JSON, dtypes (F32/BF16/F16 and F8_E4M3/F8_E5M2 accepted; others
// named as unsupported), shapes, offsets inside the data block, sizes matching shape x dtype,
// no overlaps.
// `what` names the file in messages.
Status parse_safetensors_header(const uint8_t* data, size_t size, const std::string& what,
                                std::vector<TensorRecord>* records,
                                std::map<std::string, std::string>* metadata, uint64_t* data_start);

class SafetensorsFile {
 public:
  static Result<std::shared_ptr<SafetensorsFile>> open(const std::string& path);

  const std::string& path() const { return path_; }
  // The file offset of the data block (tensor data_offsets count from it).
  uint64_t data_start() const { return data_start_; }
  const std::vector<TensorRecord>& records() const { return records_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorRecord* find(const std::string& name) const;
  // Zero-copy host view of one tensor; error naming the tensor and file if absent. An FP8
  // tensor comes back decoded to fp32 (a copy), without any scale applied.
  Result<Tensor> tensor(const std::string& name) const;

 private:
  std::string path_;
  std::shared_ptr<Storage> mapping_;
  uint64_t data_start_ = 0;
  std::vector<TensorRecord> records_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (host, any dtype) as one safetensors file; used by latent-tool and tests.
Status write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// Streams one tensor [T, frame...] to a safetensors file a frame at a time, for files whose
// frame count is only known at the end (a clip's latents). Nothing but the counts is kept in
// memory. The data goes to `<path>.partial` from a reserved offset as frames arrive; finish()
// writes the header (tensor record + `__metadata__`), fsyncs, renames the file to `path` and
// fsyncs the folder, so `path` only ever appears complete. A writer destroyed (or abort()ed)
// before finish() removes its partial file. The bytes written depend only on the frames and the
// metadata: the same input gives the same file.
class SafetensorsStreamWriter {
 public:
  struct Options {
    // Bytes reserved before the data for the 8-byte length and the header (a multiple of 8).
    // At finish() a header that fits is padded with spaces up to it when the padding is under
    // 1/16 of the data; otherwise the data is moved to just after the exact header (one copy
    // at the end, for small files or headers that outgrew the reservation).
    uint64_t header_reserve = 4096;
    bool sync = true;  // fsync the file and its folder before/after the rename
  };

  static Result<std::unique_ptr<SafetensorsStreamWriter>> create(const std::string& path,
                                                                 const std::string& tensor_name,
                                                                 DType dtype,
                                                                 const Shape& frame_shape,
                                                                 const Options& options);
  static Result<std::unique_ptr<SafetensorsStreamWriter>> create(const std::string& path,
                                                                 const std::string& tensor_name,
                                                                 DType dtype,
                                                                 const Shape& frame_shape) {
    return create(path, tensor_name, dtype, frame_shape, Options());
  }
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  // One frame: exactly frame_bytes() bytes of the dtype's elements.
  Status append(const void* data, size_t bytes);
  // Writes the header with `metadata` (string values, as safetensors requires), syncs and
  // renames. An error (no frames, a failed write, rename or sync) removes the partial file.
  Status finish(const std::map<std::string, std::string>& metadata);
  // Drops the partial file; nothing appears at path(). Idempotent.
  void abort();

  int64_t frames() const { return frames_; }
  size_t frame_bytes() const { return frame_bytes_; }
  const std::string& path() const { return path_; }
  const std::string& partial_path() const { return partial_; }

 private:
  SafetensorsStreamWriter() = default;
  Status fail(Status status);

  std::string path_, partial_, tensor_name_;
  DType dtype_ = DType::kF32;
  Shape frame_shape_;
  size_t frame_bytes_ = 0;
  Options options_;
  int fd_ = -1;
  int64_t frames_ = 0;
};

// What a tensor of ComfyUI's "scaled FP8" checkpoints is to the FP8 weight beside it. Those
// files store a linear layer's `<m>.weight` in F8_E4M3 (or F8_E5M2) with `<m>.scale_weight`
// (F32; one value, or one per output row): the real weight is weight x scale_weight. They may
// also hold `<m>.scale_input` (one value: the scale an FP8 x FP8 matmul divides its input by;
// weights dequantised at load never use it, so it is ignored) and a marker tensor `scaled_fp8`
// (at the top level, after any key prefix; its dtype names the format). Newer ComfyUI files
// spell the scales `<m>.weight_scale` / `<m>.input_scale`, read the same way.
struct Fp8Companion {
  enum Kind { kNone, kWeightScale, kInputScale, kMarker };
  Kind kind = kNone;
  std::string weight;  // `<m>.weight` for the scales
};
// By name alone: `<m>.scale_weight` / `.weight_scale`, `<m>.scale_input` / `.input_scale`,
// `scaled_fp8` / `<prefix>.scaled_fp8`.
Fp8Companion fp8_companion(const std::string& name);

// All weights of one model part: a single .safetensors file, or the shards named by a
// *.safetensors.index.json ({"weight_map": {name: shard file}}).
class WeightStore {
 public:
  static Result<WeightStore> open(const std::string& path);

  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  const TensorRecord* find(const std::string& name) const;
  // A host tensor. FP8 weights come back dequantised to fp32: decoded exactly and multiplied by
  // their `<m>.scale_weight` when the file has one (see Fp8Companion); a scale of the wrong
  // shape or dtype, or a scale beside a weight that is not FP8, is an error naming the scale.
  Result<Tensor> get(const std::string& name) const;
  const std::string& path() const { return path_; }

  // The scale record of an FP8 weight (`<m>.scale_weight` or `<m>.weight_scale`), or nullptr.
  const TensorRecord* fp8_scale_of(const std::string& weight) const;
  // Empty when `name` (present in the store) is a scale or marker as Fp8Companion describes it
  // beside an FP8 weight, which is ignored or consumed with its weight; otherwise why it is
  // not one ("'<m>.scale_weight' scales '<m>.weight', which is stored as BF16, not FP8").
  // A name that is no companion at all gives "not an FP8 scale".
  std::string check_fp8_companion(const std::string& name) const;

 private:
  std::string path_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> owner_;  // tensor name -> index into files_
};

}  // namespace latent
