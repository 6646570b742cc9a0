// Helpers of the TAEHV video tests (tests/model/test_taehv.cpp, tests/gpu/test_cuda_taehv.cpp):
// clips on the host, streams fed in chunks, and a backend wrapper that measures live memory.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/models/vae/vae.h"

namespace latent::test {

// Frames [start, start + count) of a host clip [N, C, T, H, W] (any contiguous dtype -> fp32).
inline Tensor host_frames(const Tensor& clip, int64_t start, int64_t count) {
  Tensor f = clip.to_dtype(DType::kF32);
  const Shape& s = f.shape();
  const int64_t plane = s[3] * s[4];
  Tensor out = Tensor::empty({s[0], s[1], count, s[3], s[4]}, DType::kF32);
  const float* src = f.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t nc = 0; nc < s[0] * s[1]; ++nc)
    std::memcpy(dst + nc * count * plane, src + (nc * s[2] + start) * plane,
                static_cast<size_t>(count * plane) * sizeof(float));
  return out;
}

// Frames of several host clips with equal N, C, H, W concatenated along T.
inline Tensor host_concat_t(const std::vector<Tensor>& parts) {
  const Shape& s = parts.front().shape();
  int64_t total = 0;
  for (const Tensor& p : parts) total += p.dim(2);
  Tensor out = Tensor::empty({s[0], s[1], total, s[3], s[4]}, DType::kF32);
  const int64_t plane = s[3] * s[4];
  float* dst = out.data_as<float>();
  for (int64_t nc = 0; nc < s[0] * s[1]; ++nc) {
    int64_t t0 = 0;
    for (const Tensor& p : parts) {
      Tensor f = p.to_dtype(DType::kF32);
      std::memcpy(dst + (nc * total + t0) * plane, f.data_as<float>() + nc * p.dim(2) * plane,
                  static_cast<size_t>(p.dim(2) * plane) * sizeof(float));
      t0 += p.dim(2);
    }
  }
  return out;
}

// Pushes host clip `x` through `stream` in chunks of the given lengths along T (cycled), then
// finish(); returns the outputs concatenated along T on the host. *padded gets finish()'s count.
inline Tensor run_chunked(VaeModel& model, VaeStream& stream, const Tensor& x,
                          const std::vector<int64_t>& chunks, int* padded = nullptr) {
  std::vector<Tensor> outs;
  Backend& be = model.backend();
  int64_t t = 0;
  for (size_t i = 0; t < x.dim(2); ++i) {
    const int64_t n = std::min(chunks[i % chunks.size()], x.dim(2) - t);
    auto dev = be.upload(host_frames(x, t, n));
    EXPECT_TRUE(dev.ok()) << dev.status().message();
    if (!dev.ok()) return Tensor();
    auto y = stream.push(*dev);
    EXPECT_TRUE(y.ok()) << y.status().message();
    if (!y.ok()) return Tensor();
    if (y->defined()) outs.push_back(*be.download(*y));
    t += n;
  }
  auto tail = stream.finish(padded);
  EXPECT_TRUE(tail.ok()) << tail.status().message();
  if (tail.ok() && tail->defined()) outs.push_back(*be.download(*tail));
  if (outs.empty()) return Tensor();
  return host_concat_t(outs);
}

// A backend that forwards the ops the TAEHV streams use to another backend and counts the bytes
// of the tensors it has handed out that are still alive (and their peak), so a test can see
// whether a stream's memory grows with the clip's length on any backend, the CPU included.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(std::shared_ptr<Backend> inner) : inner_(std::move(inner)) {}

  int64_t live_bytes() const { return live_->load(); }
  int64_t peak_bytes() const { return peak_->load(); }
  void reset_peak() { peak_->store(live_->load()); }

  std::string name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  DType compute_dtype() const override { return inner_->compute_dtype(); }
  bool supports(OpKind op, DType dtype) const override { return inner_->supports(op, dtype); }
  bool supports_dit(DitOp op, DType dtype) const override {
    return inner_->supports_dit(op, dtype);
  }
  Result<Tensor> upload(const Tensor& host) override { return track(inner_->upload(host)); }
  Result<Tensor> download(const Tensor& t) override { return inner_->download(t); }
  Status synchronize() override { return inner_->synchronize(); }
  Result<Tensor> conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                        const Tensor& residual, Activation act) override {
    return track(inner_->conv2d(x, w, bias, p, residual, act));
  }
  Result<Tensor> group_norm(const Tensor& x, int groups, const Tensor& gamma, const Tensor& beta,
                            float eps, Activation act) override {
    return track(inner_->group_norm(x, groups, gamma, beta, eps, act));
  }
  Result<Tensor> rms_norm_channels(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   Activation act) override {
    return track(inner_->rms_norm_channels(x, gamma, beta, act));
  }
  Result<Tensor> activation(const Tensor& x, Activation act) override {
    return track(inner_->activation(x, act));
  }
  Result<Tensor> add(const Tensor& a, const Tensor& b) override { return track(inner_->add(a, b)); }
  Result<Tensor> affine(const Tensor& x, float scale, float shift) override {
    return track(inner_->affine(x, scale, shift));
  }
  Result<Tensor> channel_affine(const Tensor& x, const std::vector<float>& scale,
                                const std::vector<float>& shift) override {
    return track(inner_->channel_affine(x, scale, shift));
  }
  Result<Tensor> clamp(const Tensor& x, float lo, float hi) override {
    return track(inner_->clamp(x, lo, hi));
  }
  Result<Tensor> upsample_nearest2x(const Tensor& x) override {
    return track(inner_->upsample_nearest2x(x));
  }
  Result<Tensor> interleave_phases2x(const Tensor& z) override {
    return track(inner_->interleave_phases2x(z));
  }
  Result<Tensor> slice_channels(const Tensor& x, int64_t start, int64_t count) override {
    return track(inner_->slice_channels(x, start, count));
  }
  Result<Tensor> spatial_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   int heads) override {
    return track(inner_->spatial_attention(q, k, v, heads));
  }
  Result<Tensor> concat(const std::vector<Tensor>& parts, int dim) override {
    return track(inner_->concat(parts, dim));
  }
  Result<Tensor> slice(const Tensor& x, int dim, int64_t start, int64_t count) override {
    return track(inner_->slice(x, dim, start, count));
  }
  Result<Tensor> pack_latents(const Tensor& latents) override {
    return track(inner_->pack_latents(latents));
  }
  Result<Tensor> unpack_latents(const Tensor& tokens, int64_t height, int64_t width) override {
    return track(inner_->unpack_latents(tokens, height, width));
  }

 private:
  // Wraps the result's storage in one that counts its bytes until the last view of it is gone.
  Result<Tensor> track(Result<Tensor> r) {
    if (!r.ok() || !r->defined()) return r;
    std::shared_ptr<Storage> inner = r->storage();
    const int64_t bytes = static_cast<int64_t>(inner->bytes());
    auto live = live_;
    auto peak = peak_;
    const int64_t now = live->fetch_add(bytes) + bytes;
    int64_t p = peak->load();
    while (now > p && !peak->compare_exchange_weak(p, now)) {
    }
    auto wrapped = std::make_shared<Storage>(inner->data(), inner->bytes(), inner->device(),
                                             [inner, live, bytes](void*) mutable {
                                               live->fetch_sub(bytes);
                                               inner.reset();
                                             });
    return Tensor::from_storage(wrapped, r->byte_offset(), r->shape(), r->dtype(), r->layout());
  }

  std::shared_ptr<Backend> inner_;
  std::shared_ptr<std::atomic<int64_t>> live_ = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<std::atomic<int64_t>> peak_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace latent::test
