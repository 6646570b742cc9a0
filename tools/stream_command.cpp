// latent-tool stream: is the per-frame time of vaeencode ! vaedecode on system-memory frames
// near max(copy, compute) rather than their sum? Runs the loop the elements run (stage or
// upload a host frame -> planned encode -> normalise / denormalise -> planned decode -> staged
// or direct download to a host frame) over --frames frames and reports milliseconds a frame
// for four modes:
//   copy        upload + download only (frame_to_tensor / tensor_to_frame, no model)
//   compute     the model only, on a frame already on the device
//   serial      the whole loop, every copy waited for (prefetch-depth 0)
//   overlapped  the whole loop with FrameStager / FrameDownloader at --prefetch-depth N
// and whether serial and overlapped wrote the same bytes.
#include "tools/stream_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <vector>

#include "engine/backends/frames.h"
#include "engine/backends/registry.h"
#include "engine/models/vae/planned_vae.h"
#include "engine/models/vae/vae.h"

namespace {

using latent::Result;
using latent::Status;
using latent::Tensor;
using Options = std::map<std::string, std::string>;
using Clock = std::chrono::steady_clock;

std::string opt(const Options& o, const std::string& k, const std::string& def = "") {
  auto it = o.find(k);
  return it == o.end() ? def : it->second;
}

int fail(const Status& s) {
  std::fprintf(stderr, "latent-tool stream: error: %s\n", s.message().c_str());
  return 1;
}

Result<latent::FrameFormat> parse_format(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(latent::FrameFormat::kABGR); ++i) {
    const auto f = static_cast<latent::FrameFormat>(i);
    if (name == latent::frame_format_name(f)) return f;
  }
  return Status::errorf("--format ", name,
                        ": expected a packed format (RGB, BGR, RGBA, BGRA, RGBx, BGRx, xRGB, "
                        "xBGR, ARGB, ABGR)");
}

// A packed host frame of random bytes (or zeros) and its description.
struct HostFrame {
  std::vector<uint8_t> bytes;
  latent::FrameDesc desc;
  HostFrame(latent::FrameFormat f, int w, int h, uint64_t seed, bool random) {
    const size_t row = static_cast<size_t>(w) *
                       latent::pixel_layout(latent::frame_pixel_format(f)).bytes_per_pixel;
    bytes.assign(row * h, 0);
    if (random) {
      std::mt19937_64 gen(seed);
      for (auto& b : bytes) b = static_cast<uint8_t>(gen());
    }
    desc.format = f;
    desc.width = w;
    desc.height = h;
    desc.planes[0] = bytes.data();
    desc.strides[0] = row;
  }
};

struct Loop {
  latent::VaeModel* model = nullptr;
  latent::Backend* b = nullptr;
  latent::FrameGeometry g;
  latent::FrameFormat format = latent::FrameFormat::kRGBx;
  std::unique_ptr<latent::PlannedPart> enc, dec;
  std::vector<HostFrame> in, out;  // a ring of distinct inputs, one output per input

  // sample [1, 3, H, W] -> image [1, 3, H, W] (valid until the next call), as the two
  // elements run it: planned encode, normalise, denormalise, planned decode.
  Result<Tensor> model_step(const Tensor& sample) {
    LATENT_ASSIGN_OR_RETURN(Tensor raw, enc->run(sample));
    LATENT_ASSIGN_OR_RETURN(Tensor z, model->latent_space().normalize(*b, raw));
    LATENT_ASSIGN_OR_RETURN(Tensor zr, model->latent_space().denormalize(*b, z));
    return dec->run(zr);
  }

  Status copy_frame(int i) {
    LATENT_ASSIGN_OR_RETURN(Tensor x, latent::frame_to_tensor(*b, in[i % in.size()].desc, g));
    return latent::tensor_to_frame(*b, x, g, out[i % out.size()].desc);
  }

  Status serial_frame(int i) {
    LATENT_ASSIGN_OR_RETURN(Tensor x, latent::frame_to_tensor(*b, in[i % in.size()].desc, g));
    LATENT_ASSIGN_OR_RETURN(Tensor y, model_step(x));
    return latent::tensor_to_frame(*b, y, g, out[i % out.size()].desc);
  }

  // Frames [0, n) through the stager and the downloader, `depth` frames in flight each way.
  Status overlapped(int n, int depth) {
    if (depth == 0) {  // prefetch-depth 0: the elements' synchronous path
      for (int i = 0; i < n; ++i) LATENT_TRY(serial_frame(i));
      return b->synchronize();
    }
    LATENT_ASSIGN_OR_RETURN(auto stager, latent::create_frame_stager(*b, depth));
    LATENT_ASSIGN_OR_RETURN(auto downloader, latent::create_frame_downloader(*b, depth));
    if (!stager || !downloader) {
      // Nothing to overlap with (the CPU): the serial loop, as the elements run there.
      for (int i = 0; i < n; ++i) LATENT_TRY(serial_frame(i));
      return b->synchronize();
    }
    std::deque<uint64_t> staged;
    std::deque<std::pair<uint64_t, int>> queued;  // ticket, frame
    int next_stage = 0;
    for (int i = 0; i < n; ++i) {
      while (next_stage < n && next_stage <= i + depth) {
        LATENT_ASSIGN_OR_RETURN(uint64_t t, stager->stage(in[next_stage % in.size()].desc));
        staged.push_back(t);
        ++next_stage;
      }
      LATENT_ASSIGN_OR_RETURN(Tensor x, stager->convert(staged.front(), g));
      staged.pop_front();
      LATENT_ASSIGN_OR_RETURN(Tensor y, model_step(x));
      LATENT_ASSIGN_OR_RETURN(uint64_t t, downloader->queue(y, g, format));
      queued.emplace_back(t, i);
      if (queued.size() > static_cast<size_t>(depth)) {
        LATENT_TRY(
            downloader->fetch(queued.front().first, out[queued.front().second % out.size()].desc));
        queued.pop_front();
      }
    }
    while (!queued.empty()) {
      LATENT_TRY(
          downloader->fetch(queued.front().first, out[queued.front().second % out.size()].desc));
      queued.pop_front();
    }
    return b->synchronize();
  }
};

// Milliseconds a frame of `run(i)` for i in [0, frames), after `warmup` untimed frames.
template <typename F>
Result<double> per_frame_ms(latent::Backend& b, int warmup, int frames, F run) {
  for (int i = 0; i < warmup; ++i) LATENT_TRY(run(i));
  LATENT_TRY(b.synchronize());
  const auto t0 = Clock::now();
  for (int i = 0; i < frames; ++i) LATENT_TRY(run(i));
  LATENT_TRY(b.synchronize());
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / frames;
}

}  // namespace

const char* stream_usage() {
  return "  stream  [--model M] [--size WxH] [--format RGBx] [--frames N] [--prefetch-depth N]\n"
         "          [--warmup N] [--graph 1|0] [--json]  vaeencode ! vaedecode's engine loop on\n"
         "          host frames: ms a frame for copy only, compute only, serial (depth 0) and\n"
         "          overlapped (pinned staging both ways at the prefetch depth; CUDA only)\n";
}

int cmd_stream(const Options& o) {
  int w = 1920, h = 1080;
  const std::string size = opt(o, "size", "1920x1080");
  if (std::sscanf(size.c_str(), "%dx%d", &w, &h) != 2 || w < 8 || h < 8 || w > 8192 || h > 8192)
    return fail(Status::errorf("--size ", size, ": expected WxH with sides in 8..8192"));
  auto format = parse_format(opt(o, "format", "RGBx"));
  if (!format.ok()) return fail(format.status());
  const int frames = std::atoi(opt(o, "frames", "100").c_str());
  const int depth = std::atoi(opt(o, "prefetch-depth", "2").c_str());
  const int warmup = std::atoi(opt(o, "warmup", "3").c_str());
  if (frames < 1 || depth < 0 || depth > 64 || warmup < 0)
    return fail(Status::error("--frames must be >= 1, --prefetch-depth in 0..64, --warmup >= 0"));
  const bool graph = opt(o, "graph", "1") != "0";

  latent::BackendOptions bo;
  bo.device = opt(o, "device", "auto");
  bo.dtype = opt(o, "dtype", "");
  auto backend = latent::get_backend(bo);
  if (!backend.ok()) return fail(backend.status());
  latent::VaeLoadOptions lo;
  lo.encoder = lo.decoder = true;
  auto model = latent::load_vae(opt(o, "model"), *backend, lo);
  if (!model.ok()) return fail(model.status());

  Loop loop;
  loop.model = model->get();
  loop.b = backend->get();
  loop.format = *format;
  latent::Backend& b = **backend;
  auto g = latent::plan_frame_geometry(w, h, loop.model->latent_space().downsample,
                                       latent::SizePolicy::kPad);
  if (!g.ok()) return fail(g.status());
  loop.g = *g;
  for (int i = 0; i < 4; ++i) {
    loop.in.emplace_back(*format, w, h, 1000 + i, true);
    loop.out.emplace_back(*format, w, h, 0, false);
  }

  // Plans, as the elements build them at negotiation.
  const auto t_plan = Clock::now();
  latent::PlanOptions po;
  po.graph = graph;
  {
    auto x = latent::zero_image_tensor(b, loop.g);
    if (!x.ok()) return fail(x.status());
    auto enc = latent::PlannedPart::build(*loop.model, latent::VaePart::kEncode, *x, po);
    if (!enc.ok()) return fail(enc.status());
    loop.enc = std::move(enc).value();
    auto z = latent::zero_latent_tensor(b, loop.model->latent_space().channels,
                                        loop.g.latent_height(), loop.g.latent_width());
    if (z.ok()) z = loop.model->latent_space().denormalize(b, *z);
    if (!z.ok()) return fail(z.status());
    auto dec = latent::PlannedPart::build(*loop.model, latent::VaePart::kDecode, *z, po);
    if (!dec.ok()) return fail(dec.status());
    loop.dec = std::move(dec).value();
  }
  if (Status s = b.synchronize(); !s.ok()) return fail(s);
  const double plan_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_plan).count();

  auto copy = per_frame_ms(b, warmup, frames, [&](int i) { return loop.copy_frame(i); });
  if (!copy.ok()) return fail(copy.status());
  Result<Tensor> on_device = latent::frame_to_tensor(b, loop.in[0].desc, loop.g);
  if (!on_device.ok()) return fail(on_device.status());
  auto compute = per_frame_ms(b, warmup, frames, [&](int) -> Status {
    auto y = loop.model_step(*on_device);
    return y.ok() ? latent::ok_status() : y.status();
  });
  if (!compute.ok()) return fail(compute.status());
  auto serial = per_frame_ms(b, warmup, frames, [&](int i) { return loop.serial_frame(i); });
  if (!serial.ok()) return fail(serial.status());
  std::vector<std::vector<uint8_t>> serial_out;
  for (const HostFrame& f : loop.out) serial_out.push_back(f.bytes);
  for (HostFrame& f : loop.out) std::fill(f.bytes.begin(), f.bytes.end(), 0);

  Result<double> overlapped = Status::error("not run");
  if (Status s = loop.overlapped(std::min(warmup + 1, frames), depth); !s.ok()) return fail(s);
  {
    const auto t0 = Clock::now();
    if (Status s = loop.overlapped(frames, depth); !s.ok()) return fail(s);
    overlapped = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / frames;
  }
  // Output slot k holds the frame made from input k in both modes (written slots only).
  bool identical = true;
  for (size_t i = 0; i < loop.out.size() && i < static_cast<size_t>(frames); ++i)
    identical = identical && loop.out[i].bytes == serial_out[i];

  const double sum = *copy + *compute, mx = std::max(*copy, *compute);
  std::printf("stream %dx%d %s, %d frames, %s %s, graphs %s/%s, plans built in %.1f ms\n", w, h,
              latent::frame_format_name(*format), frames, b.name().c_str(),
              latent::dtype_name(b.compute_dtype()), loop.enc->uses_graph() ? "on" : "off",
              loop.dec->uses_graph() ? "on" : "off", plan_ms);
  std::printf("  %-28s %9.3f ms/frame\n", "copy (upload+download)", *copy);
  std::printf("  %-28s %9.3f ms/frame\n", "compute (frame on device)", *compute);
  std::printf("  %-28s %9.3f ms/frame   (copy + compute = %.3f)\n", "serial (depth 0)", *serial,
              sum);
  std::printf("  %-28s %9.3f ms/frame   (max(copy, compute) = %.3f)\n",
              ("overlapped (depth " + std::to_string(depth) + ")").c_str(), *overlapped, mx);
  std::printf("  overlapped output %s serial output\n",
              identical ? "identical to" : "DIFFERS from");
  if (o.count("json"))
    std::printf(
        "{\"command\": \"stream\", \"width\": %d, \"height\": %d, \"format\": \"%s\", "
        "\"frames\": %d, \"prefetch_depth\": %d, \"device\": \"%s\", \"dtype\": \"%s\", "
        "\"graph\": %s, \"plan_ms\": %.3f, \"copy_ms\": %.4f, \"compute_ms\": %.4f, "
        "\"serial_ms\": %.4f, \"overlapped_ms\": %.4f, \"max_copy_compute_ms\": %.4f, "
        "\"sum_copy_compute_ms\": %.4f, \"identical\": %s}\n",
        w, h, latent::frame_format_name(*format), frames, depth, b.name().c_str(),
        latent::dtype_name(b.compute_dtype()),
        loop.enc->uses_graph() && loop.dec->uses_graph() ? "true" : "false", plan_ms, *copy,
        *compute, *serial, *overlapped, mx, sum, identical ? "true" : "false");
  return identical ? 0 : 3;
}
