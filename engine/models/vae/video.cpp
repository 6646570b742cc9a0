// Video mode defaults of VaeModel (vae.h): whole clips through one VaeStream.
#include <memory>
#include <vector>

#include "engine/models/vae/vae.h"

namespace latent {

Tensor frame_view(const Tensor& frames, int64_t start, int64_t count) {
  const size_t frame = frames.nbytes() / static_cast<size_t>(frames.dim(0));
  return Tensor::from_storage(
      frames.storage(), frames.byte_offset() + frame * static_cast<size_t>(start),
      {count, frames.dim(1), frames.dim(2), frames.dim(3)}, frames.dtype(), frames.layout());
}

Result<std::unique_ptr<VaeStream>> VaeModel::open_stream(bool encoder) {
  return Status::errorf(info().architecture, " (", info().variant,
                        ") is an image model: it has no video mode (",
                        encoder ? "encoder" : "decoder", " stream requested)");
}

namespace {

// Pushes `x` whole through a new stream of `model` and concatenates what comes out along time.
Result<Tensor> run_clip(VaeModel& model, const Tensor& x, bool encoder) {
  const char* what = encoder ? "encode_video" : "decode_video";
  if (x.shape().size() != 5)
    return Status::errorf(what, ": expected a 5-D tensor [N, C, T, H, W], got ",
                          shape_str(x.shape()));
  auto stream = model.open_stream(encoder);
  if (!stream.ok()) return stream.status();
  std::vector<Tensor> parts;
  auto y = (*stream)->push(x);
  if (!y.ok()) return y.status().with_context(what);
  if (y->defined()) parts.push_back(*y);
  auto tail = (*stream)->finish();
  if (!tail.ok()) return tail.status().with_context(what);
  if (tail->defined()) parts.push_back(*tail);
  if (parts.empty()) return Status::errorf(what, ": the clip produced no output");
  if (parts.size() == 1) return parts[0];
  return model.backend().concat(parts, 2);
}

}  // namespace

Result<Tensor> VaeModel::encode_video(const Tensor& sample) {
  return run_clip(*this, sample, true);
}

Result<Tensor> VaeModel::decode_video(const Tensor& latent) {
  return run_clip(*this, latent, false);
}

}  // namespace latent
