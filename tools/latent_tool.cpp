// latent-tool: inspect models and run their parts outside GStreamer (our trtexec).
//
//   latent-tool inspect [MODEL]
//   latent-tool encode  [--model M] --input IMAGE --output LATENTS.safetensors
//   latent-tool decode  [--model M] --input LATENTS.safetensors --output IMAGE
//   latent-tool run     [--model M] --part encoder|decoder --inputs IN.safetensors
//                       --outputs OUT.safetensors [--warmup N] [--repeat N]
//   latent-tool compare IMAGE_A IMAGE_B     (PSNR and SSIM)
//   latent-tool stream  [--model M] --size WxH ...  (tools/stream_command.h)
// Common options: --device auto|cpu|cuda[:N]  --dtype fp32|bf16|fp16
// MODEL is a diffusers folder, a pipeline root (its vae/), a single .safetensors file, or
// empty for the built-in default model.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/registry.h"
#include "engine/core/log.h"
#include "engine/models/vae/planned_vae.h"  // plans: --graph
#include "engine/models/vae/vae.h"
#include "engine/weights/safetensors.h"
#include "tools/dit_commands.h"
#include "tools/stream_command.h"

#if LATENT_TOOL_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace {

using latent::Result;
using latent::Status;
using latent::Tensor;

struct Args {
  std::string command;
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = options.find(k);
    return it == options.end() ? def : it->second;
  }
};

const char* kUsage =
    "usage: latent-tool COMMAND [options]\n"
    "  inspect [MODEL]                          architecture, parts, parameters, latent space\n"
    "  encode  [--model M] --input IMG --output LAT.safetensors\n"
    "                                           image -> normalised latents (+ frame size)\n"
    "  decode  [--model M] --input LAT.safetensors --output IMG\n"
    "  run     [--model M] --part encoder|decoder --inputs IN.safetensors --outputs OUT.safetensors\n"
    "          [--warmup N] [--repeat N] [--json]  one model part on raw tensors, timed\n"
    "          [--graph 1|0]  plan the part for the input shape and replay it as a CUDA graph\n"
    "          (default 1 on CUDA; the plan is built before the timed runs)\n"
    "          encoder: `sample` [N,3,H,W] in [-1,1] -> `latent_mean` (TAESD family: `latents`)\n"
    "          decoder: `latent` (un-normalised) -> `sample` in [-1,1]\n"
    "          video models (5-D): `sample` [N,3,T,H,W] -> `latent_mean` [N,C,1+ceil((T-1)/4),h,w];\n"
    "          `latent` [N,C,t,h,w] -> `sample` [N,3,1+4(t-1),H,W]  [--chunk N] [--stream-repeat K]\n"
    "  compare IMG_A IMG_B                      PSNR (dB) and SSIM of two images\n"
    "options: --device auto|cpu|cuda|cuda:N (default auto)  --dtype fp32|bf16|fp16\n"
    "         --verbose  (engine log to stderr)\n"
    "MODEL: diffusers folder, pipeline root (uses vae/), single .safetensors file;\n"
    "       omitted = the built-in default model\n";

Result<Args> parse_args(int argc, char** argv) {
  Args a;
  if (argc < 2) return Status::error("no command given");
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) == 0) {
      std::string key = s.substr(2), value;
      auto eq = key.find('=');
      if (eq != std::string::npos) {
        value = key.substr(eq + 1);
        key = key.substr(0, eq);
      } else if (key == "verbose" || key == "help" || key == "json") {
        value = "1";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return Status::errorf("option --", key, " needs a value");
      }
      a.options[key] = value;
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

Result<std::shared_ptr<latent::Backend>> backend_for(const Args& a) {
  latent::BackendOptions o;
  o.device = a.get("device", "auto");
  o.dtype = a.get("dtype", "");
  return latent::get_backend(o);
}

Result<std::unique_ptr<latent::VaeModel>> model_for(const Args& a, bool enc, bool dec) {
  LATENT_ASSIGN_OR_RETURN(auto backend, backend_for(a));
  latent::VaeLoadOptions lo;
  lo.encoder = enc;
  lo.decoder = dec;
  std::string path = a.get("model", a.positional.empty() ? "" : a.positional[0]);
  return latent::load_vae(path, backend, lo);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int fail(const Status& s) {
  std::fprintf(stderr, "latent-tool: error: %s\n", s.message().c_str());
  return 1;
}

// --- inspect ---------------------------------------------------------------------------
int cmd_inspect(const Args& a) {
  auto model = model_for(a, true, true);
  if (!model.ok()) return fail(model.status());
  const latent::ModelInfo& info = (*model)->info();
  const latent::LatentSpace& ls = info.latent_space;
  std::printf("model:         %s\n", info.source.given.empty() ? "(built-in default)" : info.source.given.c_str());
  std::printf("form:          %s (%s)\n", info.source.form.c_str(), info.source.weights_path.c_str());
  std::printf("architecture:  %s%s%s\n", info.architecture.c_str(), info.variant.empty() ? "" : " / ",
              info.variant.c_str());
  int64_t total = 0;
  for (const auto& p : info.parts) {
    std::printf("part:          %-8s %12lld parameters\n", p.name.c_str(), static_cast<long long>(p.parameters));
    total += p.parameters;
  }
  std::printf("parameters:    %lld\n", static_cast<long long>(total));
  std::printf("weights dtype:");
  for (const auto& [dt, n] : info.storage_dtypes)
    std::printf(" %s (%lld parameters)", dt.c_str(), static_cast<long long>(n));
  std::printf("\n");
  std::printf("latent space:  %s, %d channels, %dx downsampling\n", ls.name.c_str(), ls.channels, ls.downsample);
  bool uniform = true;
  for (size_t c = 1; c < ls.scale.size(); ++c)
    uniform = uniform && ls.scale[c] == ls.scale[0] && ls.shift[c] == ls.shift[0];
  if (!ls.scale.empty() && uniform)
    std::printf("normalisation: (z - %g) * %g\n", ls.shift[0], ls.scale[0]);
  else if (!ls.scale.empty())
    std::printf("normalisation: (z - mean[c]) * scale[c], per channel (%zu channels)\n", ls.scale.size());
  if ((*model)->supports_video())
    std::printf("video:         temporal factor %d (frame 0 alone, then %d frames a latent frame)\n",
                (*model)->temporal_factor(), (*model)->temporal_factor());
  std::printf("backend:       %s, compute %s\n", (*model)->backend().name().c_str(),
              latent::dtype_name((*model)->backend().compute_dtype()));
  if (!info.description.empty()) {
    std::printf("config:\n");
    size_t pos = 0;
    while (pos < info.description.size()) {
      size_t nl = info.description.find('\n', pos);
      if (nl == std::string::npos) nl = info.description.size();
      std::printf("  %s\n", info.description.substr(pos, nl - pos).c_str());
      pos = nl + 1;
    }
  }
  return 0;
}

#if LATENT_TOOL_OPENCV
// --- images ----------------------------------------------------------------------------
// RGB8 image -> [1, 3, H, W] fp32 in [-1, 1].
Tensor image_to_tensor(const cv::Mat& rgb) {
  Tensor t = Tensor::empty({1, 3, rgb.rows, rgb.cols}, latent::DType::kF32);
  float* p = t.data_as<float>();
  const int64_t plane = static_cast<int64_t>(rgb.rows) * rgb.cols;
  for (int y = 0; y < rgb.rows; ++y) {
    const uint8_t* row = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < rgb.cols; ++x)
      for (int c = 0; c < 3; ++c)
        p[c * plane + static_cast<int64_t>(y) * rgb.cols + x] = row[x * 3 + c] / 127.5f - 1.f;
  }
  return t;
}

cv::Mat tensor_to_image(const Tensor& t) {  // [1, 3, H, W] fp32 host -> RGB8
  const int h = static_cast<int>(t.dim(2)), w = static_cast<int>(t.dim(3));
  cv::Mat rgb(h, w, CV_8UC3);
  std::vector<float> v = t.to_floats();
  const int64_t plane = static_cast<int64_t>(h) * w;
  for (int y = 0; y < h; ++y) {
    uint8_t* row = rgb.ptr<uint8_t>(y);
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        float f = (v[c * plane + static_cast<int64_t>(y) * w + x] + 1.f) * 127.5f;
        row[x * 3 + c] = static_cast<uint8_t>(std::lround(std::clamp(f, 0.f, 255.f)));
      }
  }
  return rgb;
}

Result<cv::Mat> read_rgb(const std::string& path) {
  cv::Mat bgr;
  try {
    bgr = cv::imread(path, cv::IMREAD_COLOR);
  } catch (const cv::Exception& e) {
    return Status::errorf("cannot read image '", path, "': ", e.what());
  }
  if (bgr.empty()) return Status::errorf("cannot read image '", path, "' (missing or not an image)");
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

Status write_rgb(const std::string& path, const cv::Mat& rgb) {
  cv::Mat bgr;
  cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
  try {
    if (!cv::imwrite(path, bgr)) return Status::errorf("cannot write image '", path, "'");
  } catch (const cv::Exception& e) {
    return Status::errorf("cannot write image '", path, "': ", e.what());
  }
  return Status();
}

int cmd_encode(const Args& a) {
  std::string in = a.get("input"), out = a.get("output");
  if (in.empty() || out.empty()) return fail(Status::error("encode needs --input IMAGE and --output FILE"));
  auto model = model_for(a, true, false);
  if (!model.ok()) return fail(model.status());
  auto& m = **model;
  auto rgb = read_rgb(in);
  if (!rgb.ok()) return fail(rgb.status());
  // Pad to a multiple of the downsampling factor by repeating the edge; decode crops it away.
  const int f = m.downsample();
  const int h = rgb->rows, w = rgb->cols;
  cv::Mat padded;
  cv::copyMakeBorder(*rgb, padded, 0, (f - h % f) % f, 0, (f - w % f) % f, cv::BORDER_REPLICATE);
  auto& b = m.backend();
  auto x = b.upload(image_to_tensor(padded));
  if (!x.ok()) return fail(x.status());
  auto t0 = std::chrono::steady_clock::now();
  auto z = m.encode(*x);
  if (!z.ok()) return fail(z.status());
  auto zn = m.latent_space().normalize(b, *z);
  if (!zn.ok()) return fail(zn.status());
  auto host = b.download(*zn);
  if (!host.ok()) return fail(host.status());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  Status s = latent::write_safetensors(out, {{"latent", *host}},
                                       {{"latent_space", m.latent_space().name},
                                        {"frame_width", std::to_string(w)},
                                        {"frame_height", std::to_string(h)},
                                        {"normalised", "true"}});
  if (!s.ok()) return fail(s);
  std::printf("encoded %s (%dx%d) -> %s %s, latent space %s, %.1f ms\n", in.c_str(), w, h, out.c_str(),
              latent::shape_str(host->shape()).c_str(), m.latent_space().name.c_str(), ms);
  return 0;
}

int cmd_decode(const Args& a) {
  std::string in = a.get("input"), out = a.get("output");
  if (in.empty() || out.empty()) return fail(Status::error("decode needs --input FILE and --output IMAGE"));
  auto model = model_for(a, false, true);
  if (!model.ok()) return fail(model.status());
  auto& m = **model;
  auto file = latent::SafetensorsFile::open(in);
  if (!file.ok()) return fail(file.status());
  auto lat = (*file)->tensor("latent");
  if (!lat.ok()) return fail(lat.status());
  const auto& meta = (*file)->metadata();
  auto space = meta.find("latent_space");
  if (space != meta.end() && space->second != m.latent_space().name)
    return fail(Status::errorf("latents in '", in, "' are in latent space '", space->second,
                               "' but the model's is '", m.latent_space().name, "'"));
  if (lat->rank() != 4 || lat->dim(1) != m.latent_space().channels)
    return fail(Status::errorf("tensor 'latent' in '", in, "' has shape ", latent::shape_str(lat->shape()),
                               ", expected [N, ", m.latent_space().channels, ", h, w]"));
  auto& b = m.backend();
  auto zn = b.upload(*lat);
  if (!zn.ok()) return fail(zn.status());
  auto t0 = std::chrono::steady_clock::now();
  auto z = m.latent_space().denormalize(b, *zn);
  if (!z.ok()) return fail(z.status());
  auto x = m.decode(*z);
  if (!x.ok()) return fail(x.status());
  auto host = b.download(*x);
  if (!host.ok()) return fail(host.status());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  cv::Mat rgb = tensor_to_image(*host);
  auto fw = meta.find("frame_width"), fh = meta.find("frame_height");
  if (fw != meta.end() && fh != meta.end()) {
    int w = std::atoi(fw->second.c_str()), h = std::atoi(fh->second.c_str());
    if (w > 0 && h > 0 && w <= rgb.cols && h <= rgb.rows) rgb = rgb(cv::Rect(0, 0, w, h)).clone();
  }
  Status s = write_rgb(out, rgb);
  if (!s.ok()) return fail(s);
  std::printf("decoded %s -> %s (%dx%d), %.1f ms\n", in.c_str(), out.c_str(), rgb.cols, rgb.rows, ms);
  return 0;
}

#endif  // LATENT_TOOL_OPENCV

// --- run -------------------------------------------------------------------------------
// video: a 5-D `sample` [N,3,T,H,W] / `latent` [N,C,t,h,w] through the model's video mode
// (VaeStream), diffusers' conventions. --chunk N pushes N frames at a time (default: the whole
// clip in one push); --stream-repeat K pushes the clip K times into one stream (a K times longer
// clip: frames/s and peak memory of long streams; the output written is the first pass's).
int run_video(const Args& a, latent::VaeModel& m, const Tensor& host_in, const Tensor& x, bool enc,
              const std::string& part, const std::string& out) {
  auto& b = m.backend();
  if (!m.supports_video())
    return fail(Status::errorf("run: ", latent::shape_str(host_in.shape()), " is a video tensor but ",
                               m.info().architecture, " (", m.info().variant,
                               ") has no video mode; pass [N, C, H, W] images"));
  if (a.options.count("graph") && a.get("graph") != "0")
    std::fprintf(stderr, "--graph: video mode runs without CUDA graphs (chunks change the causal "
                         "caches between calls); ignored\n");
  const int warmup = std::max(0, std::atoi(a.get("warmup", "1").c_str()));
  const int repeat = std::max(1, std::atoi(a.get("repeat", "1").c_str()));
  const int64_t frames = x.dim(2);
  const int64_t chunk = std::atoll(a.get("chunk", "0").c_str());
  const int passes = std::atoi(a.get("stream-repeat", "1").c_str());
  if (chunk < 0 || passes < 1) return fail(Status::error("run: --chunk must be >= 0 and --stream-repeat >= 1"));
  std::vector<double> times;
  Tensor y;
  int64_t out_frames = 0;
  b.reset_peak_memory();
  const int64_t base_bytes = b.peak_memory_bytes();  // weights and the input, resident before
  for (int i = 0; i < warmup + repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto stream = m.open_stream(enc);
    if (!stream.ok()) return fail(stream.status());
    std::vector<Tensor> parts;  // outputs of the first pass
    int64_t produced = 0;
    for (int pass = 0; pass < passes; ++pass) {
      for (int64_t at = 0; at < frames;) {
        const int64_t n = chunk > 0 ? std::min(chunk, frames - at) : frames;
        Tensor piece = x;
        if (n != frames) {
          auto s = b.slice(x, 2, at, n);
          if (!s.ok()) return fail(s.status());
          piece = *s;
        }
        auto r = (*stream)->push(piece);
        if (!r.ok()) return fail(r.status());
        if (r->defined()) {
          produced += r->dim(2);
          if (pass == 0) parts.push_back(*r);
        }
        at += n;
      }
    }
    int padded = 0;
    auto tail = (*stream)->finish(&padded);
    if (!tail.ok()) return fail(tail.status());
    if (tail->defined()) {
      produced += tail->dim(2);
      if (passes == 1) parts.push_back(*tail);
    }
    Status s = b.synchronize();
    if (!s.ok()) return fail(s);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) times.push_back(ms);
    if (parts.empty()) return fail(Status::error("run: the clip produced no output"));
    if (parts.size() == 1) {
      y = parts[0];
    } else {
      auto joined = b.concat(parts, 2);
      if (!joined.ok()) return fail(joined.status());
      y = *joined;
    }
    out_frames = produced;
    if (padded > 0 && i == 0)
      std::fprintf(stderr, "%lld frames are not 1 + %d k: the last chunk was padded with %d copies "
                   "of the last frame (as diffusers on the padded clip)\n",
                   static_cast<long long>(frames), m.temporal_factor(), padded);
  }
  auto host_out = b.download(y);
  if (!host_out.ok()) return fail(host_out.status());
  const std::string out_name = enc ? "latent_mean" : "sample";
  Status s = latent::write_safetensors(out, {{out_name, *host_out}},
                                       {{"model", m.info().source.given}, {"part", part},
                                        {"device", b.name()}, {"dtype", latent::dtype_name(b.compute_dtype())}});
  if (!s.ok()) return fail(s);
  // frames/s counts video frames: the encoder's input frames, the decoder's output frames.
  const double video_frames = static_cast<double>(enc ? frames * passes : out_frames);
  const double med = median(times);
  std::printf("%s %s (video): %s -> %s %s on %s (%s): median %.3f ms over %d runs (min %.3f), "
              "%.1f frames/s\n",
              m.info().architecture.c_str(), part.c_str(), latent::shape_str(host_in.shape()).c_str(),
              out_name.c_str(), latent::shape_str(host_out->shape()).c_str(), b.name().c_str(),
              latent::dtype_name(b.compute_dtype()), med, repeat,
              *std::min_element(times.begin(), times.end()), video_frames * 1000.0 / med);
  if (a.options.count("json"))
    std::printf("{\"part\": \"%s\", \"video\": true, \"median_ms\": %.4f, \"min_ms\": %.4f, "
                "\"runs\": %d, \"frames\": %lld, \"frames_per_s\": %.3f, \"peak_bytes\": %lld, "
                "\"base_bytes\": %lld, "
                "\"device\": \"%s\", \"dtype\": \"%s\", \"graph\": false}\n",
                part.c_str(), med, *std::min_element(times.begin(), times.end()), repeat,
                static_cast<long long>(video_frames), video_frames * 1000.0 / med,
                static_cast<long long>(b.peak_memory_bytes()), static_cast<long long>(base_bytes),
                b.name().c_str(), latent::dtype_name(b.compute_dtype()));
  return 0;
}

int cmd_run(const Args& a) {
  std::string part = a.get("part"), in = a.get("inputs"), out = a.get("outputs");
  if (part == "transformer") return cmd_run_transformer(a.options, a.positional);
  if (part != "encoder" && part != "decoder")
    return fail(Status::error("run needs --part encoder, decoder or transformer"));
  if (in.empty() || out.empty()) return fail(Status::error("run needs --inputs FILE and --outputs FILE"));
  const bool enc = part == "encoder";
  auto model = model_for(a, enc, !enc);
  if (!model.ok()) return fail(model.status());
  auto& m = **model;
  auto file = latent::SafetensorsFile::open(in);
  if (!file.ok()) return fail(file.status());
  const char* in_name = enc ? "sample" : "latent";
  auto host_in = (*file)->tensor(in_name);
  if (!host_in.ok()) return fail(host_in.status());
  auto& b = m.backend();
  auto x = b.upload(*host_in);
  if (!x.ok()) return fail(x.status());
  if (host_in->rank() == 5) return run_video(a, m, *host_in, *x, enc, part, out);
  if (a.options.count("chunk") || a.options.count("stream-repeat"))
    return fail(Status::errorf("run: --chunk and --stream-repeat are for video tensors [N, C, T, H, W]; `",
                               in_name, "` is ", latent::shape_str(host_in->shape())));
  const int warmup = std::max(0, std::atoi(a.get("warmup", "1").c_str()));
  const int repeat = std::max(1, std::atoi(a.get("repeat", "1").c_str()));
  std::vector<double> times;
  Tensor y;
  b.reset_peak_memory();
  // plans: a plan for this shape (warm-up + graph capture), built before the timed runs.
  const bool graph = a.get("graph", b.supports_capture() ? "1" : "0") != "0";
  std::unique_ptr<latent::PlannedPart> plan;
  if (graph) {
    auto t0 = std::chrono::steady_clock::now();
    latent::PlanOptions po;
    po.graph = true;
    auto built = latent::PlannedPart::build(m, enc ? latent::VaePart::kEncode : latent::VaePart::kDecode, *x, po);
    if (!built.ok()) return fail(built.status());
    plan = std::move(built).value();
    Status s = b.synchronize();
    if (!s.ok()) return fail(s);
    std::fprintf(stderr, "plan for %s built in %.1f ms (%s)\n", latent::shape_str(x->shape()).c_str(),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                 plan->uses_graph() ? "graph" : "no graph: plain forward");
  }
  for (int i = 0; i < warmup + repeat; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = plan ? plan->run(*x) : enc ? m.encode(*x) : m.decode(*x);
    if (!r.ok()) return fail(r.status());
    Status s = b.synchronize();
    if (!s.ok()) return fail(s);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) times.push_back(ms);
    y = std::move(r).value();
  }
  auto host_out = b.download(y);
  if (!host_out.ok()) return fail(host_out.status());
  const bool tiny = m.info().architecture == "AutoencoderTiny";
  std::string out_name = enc ? (tiny ? "latents" : "latent_mean") : "sample";
  Status s = latent::write_safetensors(out, {{out_name, *host_out}},
                                       {{"model", m.info().source.given}, {"part", part},
                                        {"device", b.name()}, {"dtype", latent::dtype_name(b.compute_dtype())}});
  if (!s.ok()) return fail(s);
  std::printf("%s %s: %s -> %s %s on %s (%s): median %.3f ms over %d runs (min %.3f)\n",
              m.info().architecture.c_str(), part.c_str(), latent::shape_str(host_in->shape()).c_str(),
              out_name.c_str(), latent::shape_str(host_out->shape()).c_str(), b.name().c_str(),
              latent::dtype_name(b.compute_dtype()), median(times), repeat,
              *std::min_element(times.begin(), times.end()));
  if (a.options.count("json"))
    std::printf("{\"part\": \"%s\", \"median_ms\": %.4f, \"min_ms\": %.4f, \"runs\": %d, "
                "\"peak_bytes\": %lld, \"device\": \"%s\", \"dtype\": \"%s\", \"graph\": %s}\n",
                part.c_str(), median(times), *std::min_element(times.begin(), times.end()), repeat,
                static_cast<long long>(b.peak_memory_bytes()), b.name().c_str(),
                latent::dtype_name(b.compute_dtype()), plan && plan->uses_graph() ? "true" : "false");
  return 0;
}

#if LATENT_TOOL_OPENCV
// --- compare ---------------------------------------------------------------------------
double ssim_channel(const cv::Mat& a, const cv::Mat& b) {  // CV_64F single channel
  const double c1 = 6.5025, c2 = 58.5225;  // (0.01*255)^2, (0.03*255)^2
  cv::Mat mu1, mu2, s11, s22, s12;
  cv::GaussianBlur(a, mu1, cv::Size(11, 11), 1.5);
  cv::GaussianBlur(b, mu2, cv::Size(11, 11), 1.5);
  cv::GaussianBlur(a.mul(a), s11, cv::Size(11, 11), 1.5);
  cv::GaussianBlur(b.mul(b), s22, cv::Size(11, 11), 1.5);
  cv::GaussianBlur(a.mul(b), s12, cv::Size(11, 11), 1.5);
  cv::Mat mu11 = mu1.mul(mu1), mu22 = mu2.mul(mu2), mu12 = mu1.mul(mu2);
  s11 -= mu11;
  s22 -= mu22;
  s12 -= mu12;
  cv::Mat num = (2 * mu12 + c1).mul(2 * s12 + c2);
  cv::Mat den = (mu11 + mu22 + c1).mul(s11 + s22 + c2);
  cv::Mat map;
  cv::divide(num, den, map);
  return cv::mean(map)[0];
}

int cmd_compare(const Args& a) {
  if (a.positional.size() != 2) return fail(Status::error("compare needs two images"));
  auto x = read_rgb(a.positional[0]);
  if (!x.ok()) return fail(x.status());
  auto y = read_rgb(a.positional[1]);
  if (!y.ok()) return fail(y.status());
  if (x->size() != y->size())
    return fail(Status::errorf("images differ in size: ", x->cols, "x", x->rows, " vs ", y->cols, "x", y->rows));
  double psnr = cv::PSNR(*x, *y);
  cv::Mat xf, yf;
  x->convertTo(xf, CV_64F);
  y->convertTo(yf, CV_64F);
  std::vector<cv::Mat> xc, yc;
  cv::split(xf, xc);
  cv::split(yf, yc);
  double ssim = 0;
  for (int c = 0; c < 3; ++c) ssim += ssim_channel(xc[c], yc[c]) / 3;
  std::printf("PSNR %.2f dB  SSIM %.4f\n", psnr, ssim);
  return 0;
}

#else
int no_images(const Args& a) {
  return fail(Status::errorf("'", a.command, "' needs image support: this latent-tool was built without OpenCV"));
}
int cmd_encode(const Args& a) { return no_images(a); }
int cmd_decode(const Args& a) { return no_images(a); }
int cmd_compare(const Args& a) { return no_images(a); }
#endif  // LATENT_TOOL_OPENCV

void log_to_stderr(latent::LogLevel level, const char*, int, const char* msg, void*) {
  std::fprintf(stderr, "[latent %d] %s\n", static_cast<int>(level), msg);
}

}  // namespace

int main(int argc, char** argv) {
  auto args = parse_args(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "latent-tool: %s\n%s", args.status().message().c_str(), kUsage);
    return 2;
  }
  const Args& a = *args;
  if (a.options.count("verbose")) latent::set_log_callback(log_to_stderr, nullptr);
  if (a.command == "help" || a.command == "--help" || a.command == "-h" || a.options.count("help")) {
    std::printf("%s%s%s", kUsage, stream_usage(), dit_usage());
    return 0;
  }
  if (a.command == "inspect") return cmd_inspect(a);
  if (a.command == "encode") return cmd_encode(a);
  if (a.command == "decode") return cmd_decode(a);
  if (a.command == "run") return cmd_run(a);
  if (a.command == "denoise") return cmd_denoise(a.options, a.positional);
  if (a.command == "stream") return cmd_stream(a.options);
  if (a.command == "compare") return cmd_compare(a);
  std::fprintf(stderr, "latent-tool: unknown command '%s'\n%s", a.command.c_str(), kUsage);
  return 2;
}
