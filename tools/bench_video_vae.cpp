// latent-bench-video: frames per second and peak device memory of a video VAE's streams
// (VaeModel::open_stream), the way a media element drives them: one frame (encoder) or one latent
// frame (decoder) a push, every output dropped as it comes. Runs on any backend (CPU-only builds
// too). bench/bench_taehv.py drives it next to taehv.py.
//
//   latent-bench-video --model taew2_1.safetensors --device cuda --dtype fp16
//                      --size 1280x720 --frames 81 --part decoder [--warmup 9] [--json]
//
// --frames counts video frames: the decoder gets 1 + (frames - 1) / 4 latent frames (which
// decode to that many frames when frames = 1 + 4k). Inputs are random (one frame reused).
//
// --clip-in IN.safetensors --clip-out OUT.safetensors instead runs one whole clip (tensor
// "input", [N, C, T, H, W] in diffusers' conventions) through encode_video / decode_video and
// writes "output" (fp32), so a benchmark can check the answer against a reference.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/backends/registry.h"
#include "engine/core/tensor.h"
#include "engine/models/vae/vae.h"
#include "engine/weights/safetensors.h"

namespace {

using namespace latent;

struct Args {
  std::string model, device = "auto", dtype, part = "decoder", clip_in, clip_out;
  int width = 1280, height = 720, frames = 81, warmup = 9;
  bool json = false;
};

int usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: latent-bench-video --model PATH [--device auto|cpu|cuda[:N]] "
               "[--dtype fp32|bf16|fp16] [--size WxH] [--frames N] [--part encoder|decoder] "
               "[--warmup N] [--json] [--clip-in IN.safetensors --clip-out OUT.safetensors]\n",
               msg);
  return 2;
}

Tensor random_host(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  float* d = t.data_as<float>();
  uint32_t s = seed * 2654435761u + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    d[i] = static_cast<float>(s >> 8) / 8388608.f - 1.f;  // [-1, 1)
  }
  return t;
}

struct Run {
  double seconds = 0;
  int64_t frames_out = 0;
};

// Pushes `count` inputs (the same tensor) through a new stream, then finish(); synchronised.
Result<Run> run_stream(VaeModel& model, bool encoder, const Tensor& input, int count) {
  Backend& be = model.backend();
  LATENT_TRY(be.synchronize());
  auto start = std::chrono::steady_clock::now();
  auto stream = model.open_stream(encoder);
  if (!stream.ok()) return stream.status();
  Run r;
  for (int i = 0; i < count; ++i) {
    LATENT_ASSIGN_OR_RETURN(Tensor y, (*stream)->push(input));
    if (y.defined()) r.frames_out += y.dim(2);
  }
  LATENT_ASSIGN_OR_RETURN(Tensor tail, (*stream)->finish());
  if (tail.defined()) r.frames_out += tail.dim(2);
  LATENT_TRY(be.synchronize());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

int run(const Args& a) {
  auto backend = get_backend(BackendOptions{a.device, a.dtype});
  if (!backend.ok()) return usage(backend.status().message().c_str());
  VaeLoadOptions opts;
  opts.encoder = a.part == "encoder";
  opts.decoder = a.part == "decoder";
  auto model = load_vae(a.model, *backend, opts);
  if (!model.ok()) {
    std::fprintf(stderr, "latent-bench-video: %s\n", model.status().message().c_str());
    return 1;
  }
  VaeModel& m = **model;
  if (!m.supports_video()) {
    std::fprintf(stderr, "latent-bench-video: %s is not a video model\n", a.model.c_str());
    return 1;
  }
  Backend& be = **backend;
  const bool enc = a.part == "encoder";
  if (!a.clip_in.empty()) {  // one whole clip, written out for checking
    auto file = SafetensorsFile::open(a.clip_in);
    if (!file.ok()) return usage(file.status().message().c_str());
    auto host = (*file)->tensor("input");
    if (!host.ok()) return usage(host.status().message().c_str());
    auto x = be.upload(*host);
    if (!x.ok()) return usage(x.status().message().c_str());
    auto y = enc ? m.encode_video(*x) : m.decode_video(*x);
    if (!y.ok()) {
      std::fprintf(stderr, "latent-bench-video: %s\n", y.status().message().c_str());
      return 1;
    }
    auto out = be.download(*y);
    if (!out.ok()) return usage(out.status().message().c_str());
    Status st = write_safetensors(a.clip_out, {{"output", *out}});
    if (!st.ok()) return usage(st.message().c_str());
    std::printf("%s -> %s: %s\n", a.clip_in.c_str(), a.clip_out.c_str(),
                shape_str(out->shape()).c_str());
    return 0;
  }
  const int f = m.downsample(), tf = m.temporal_factor();
  if (a.width % f || a.height % f) {
    std::fprintf(stderr, "latent-bench-video: %dx%d is not a multiple of %d\n", a.width, a.height,
                 f);
    return 1;
  }
  const Shape shape = enc ? Shape{1, 3, 1, a.height, a.width}
                          : Shape{1, m.latent_space().channels, 1, a.height / f, a.width / f};
  auto input = be.upload(random_host(shape, 1));
  if (!input.ok()) return usage(input.status().message().c_str());
  const int count = enc ? a.frames : 1 + (a.frames - 1) / tf;
  const int warm = enc ? a.warmup : 1 + (a.warmup - 1) / tf;
  if (warm > 0) {
    auto w = run_stream(m, enc, *input, warm);  // plans the convolutions (cuDNN search)
    if (!w.ok()) {
      std::fprintf(stderr, "latent-bench-video: %s\n", w.status().message().c_str());
      return 1;
    }
  }
  be.reset_peak_memory();
  auto r = run_stream(m, enc, *input, count);
  if (!r.ok()) {
    std::fprintf(stderr, "latent-bench-video: %s\n", r.status().message().c_str());
    return 1;
  }
  const int64_t peak = be.peak_memory_bytes();
  const int64_t video_frames = enc ? a.frames : r->frames_out;
  const double fps = video_frames / r->seconds;
  std::printf("%s %s %s %dx%d: %lld frames in %.3f s, %.1f frames/s, peak %s\n",
              m.info().variant.c_str(), a.part.c_str(), be.name().c_str(), a.width, a.height,
              static_cast<long long>(video_frames), r->seconds, fps,
              peak < 0 ? "not tracked" : (std::to_string(peak / 1048576) + " MiB").c_str());
  if (a.json)
    std::printf(
        "{\"model\": \"%s\", \"variant\": \"%s\", \"part\": \"%s\", \"device\": \"%s\", "
        "\"dtype\": \"%s\", \"width\": %d, \"height\": %d, \"frames\": %lld, "
        "\"pushes\": %d, \"seconds\": %.6f, \"fps\": %.3f, \"peak_bytes\": %lld}\n",
        a.model.c_str(), m.info().variant.c_str(), a.part.c_str(), be.name().c_str(),
        dtype_name(be.compute_dtype()), a.width, a.height, static_cast<long long>(video_frames),
        count, r->seconds, fps, static_cast<long long>(peak));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    auto int_value = [&](int* out) {
      const char* v = value();
      char* end = nullptr;
      long n = v ? std::strtol(v, &end, 10) : 0;
      if (!v || *end || n < 0 || n > 1000000) return false;
      *out = static_cast<int>(n);
      return true;
    };
    if (k == "--model") {
      const char* v = value();
      if (!v) return usage("--model needs a path");
      a.model = v;
    } else if (k == "--device" || k == "--dtype" || k == "--part" || k == "--clip-in" ||
               k == "--clip-out") {
      const char* v = value();
      if (!v) return usage((k + " needs a value").c_str());
      (k == "--device"    ? a.device
       : k == "--dtype"   ? a.dtype
       : k == "--part"    ? a.part
       : k == "--clip-in" ? a.clip_in
                          : a.clip_out) = v;
    } else if (k == "--size") {
      const char* v = value();
      if (!v || std::sscanf(v, "%dx%d", &a.width, &a.height) != 2 || a.width < 1 || a.height < 1)
        return usage("--size needs WxH");
    } else if (k == "--frames") {
      if (!int_value(&a.frames) || a.frames < 1) return usage("--frames needs a count >= 1");
    } else if (k == "--warmup") {
      if (!int_value(&a.warmup)) return usage("--warmup needs a count");
    } else if (k == "--json") {
      a.json = true;
    } else if (k == "--help" || k == "-h") {
      usage("latent-bench-video: a video VAE's streams, frames/s and peak memory");
      return 0;
    } else {
      return usage(("unknown option " + k).c_str());
    }
  }
  if (a.model.empty()) return usage("--model is required");
  if (a.part != "encoder" && a.part != "decoder") return usage("--part is encoder or decoder");
  if (a.clip_in.empty() != a.clip_out.empty()) return usage("--clip-in and --clip-out go together");
  return run(a);
}
