// latent-tool: inspect models and run their parts outside GStreamer (our trtexec).
//
//   latent-tool inspect [MODEL]
//   latent-tool encode  [--model M] --input IMAGE --output LATENTS.safetensors
//   latent-tool decode  [--model M] --input LATENTS.safetensors --output IMAGE
//   latent-tool run     [--model M] --part encoder|decoder --inputs IN.safetensors
//                       --outputs OUT.safetensors [--warmup N] [--repeat N]
//   latent-tool compare IMAGE_A IMAGE_B     (PSNR and SSIM)
//   latent-tool stream  [--model M] --size WxH ...  (tools/stream_command.h)
//   latent-tool denoise --model ROOT --embeds E.safetensors ...  (tools/dit_commands.h)
// Common options: --device auto|cpu|cuda[:N]  --dtype fp32|bf16|fp16|fp8  --verbose
// (fp8: the transformer's linear layers, in transformer runs and denoise)
// MODEL is a diffusers folder, a pipeline root (its vae/), a single .safetensors file, or
// empty for the built-in default model.
//
// The command line is parsed by CLI11 (make_cli below): each command is a subcommand with its
// own --help, typed and range-checked options, and unknown options or stray arguments are
// refused. The command functions read the parsed values as text from Args::options, as before,
// so a command's new option is one line in make_cli.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/backends/registry.h"
#include "engine/core/log.h"
#include "engine/models/vae/planned_vae.h"  // plans: --graph
#include "engine/models/vae/vae.h"
#include "engine/weights/safetensors.h"
#include "tools/dit_commands.h"
#include "tools/latent_file_commands.h"
#include "tools/lora_commands.h"
#include "tools/stream_command.h"

#if LATENT_TOOL_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/core/utils/logger.hpp>
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

Result<std::shared_ptr<latent::Backend>> backend_for(const Args& a) {
  latent::BackendOptions o;
  o.device = a.get("device", "auto");
  o.dtype = a.get("dtype", "");
  if (o.dtype == "fp8")
    return Status::error(
        "--dtype fp8 applies to the transformer's linear layers (run --part transformer, "
        "denoise); VAEs run in fp32, bf16 or fp16");
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

// Output paths that cannot be written are refused before anything loads or runs (a denoise on
// a real model takes minutes): a folder, a file in a folder that does not exist, an image name
// OpenCV has no writer for.
Status check_outputs(const Args& a) {
  for (const char* key : {"output", "outputs", "output-latents", "output-sample"}) {
    auto it = a.options.find(key);
    if (it == a.options.end() || it->second.empty()) continue;
    const std::string& path = it->second;
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      return Status::errorf("--", key, " ", path, " is a folder; give a file name");
    const size_t slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "."
                            : slash == 0               ? "/"
                                                       : path.substr(0, slash);
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return Status::errorf("--", key, " ", path, ": folder '", dir, "' does not exist");
#if LATENT_TOOL_OPENCV
    const bool image =
        std::string(key) == "output" && (a.command == "decode" || a.command == "denoise");
    if (image && !cv::haveImageWriter(path))
      return Status::errorf("--", key, " ", path,
                            ": no image writer for that name (use .png, .jpg, .bmp, .tiff, .webp)");
#endif
  }
  return Status();
}

// --- inspect ---------------------------------------------------------------------------
int cmd_inspect(const Args& a) {
  // A LoRA file: what it is and which transformer it fits.
  if (const std::string p = a.positional.empty() ? a.get("model") : a.positional[0]; !p.empty())
    if (const int rc = inspect_lora(p); rc >= 0) return rc;
  // A transformer checkpoint (e.g. ComfyUI's FP8 single files): what it holds.
  if (a.positional.size() == 1)
    if (const int rc = inspect_transformer_file(a.positional[0]); rc >= 0) return rc;
  if (a.positional.size() == 1 && is_latent_file(a.positional[0])) return inspect_latent_file(a.positional[0]);
  if (a.options.count("model") && !a.positional.empty())
    return fail(Status::errorf("inspect: give the model once, as --model or as MODEL (got --model ",
                               a.get("model"), " and ", a.positional[0], ")"));
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

// Keeps stderr closed while it lives: the image codecs under OpenCV (libpng's "iCCP: known
// incorrect sRGB profile", ...) print warnings of their own that OpenCV's log level does not
// reach; our messages name the file and the problem instead.
class QuietStderr {
 public:
  QuietStderr() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (saved_ >= 0 && null >= 0) ::dup2(null, 2);
    if (null >= 0) ::close(null);
  }
  ~QuietStderr() {
    std::fflush(stderr);
    if (saved_ >= 0) {
      ::dup2(saved_, 2);
      ::close(saved_);
    }
  }
  QuietStderr(const QuietStderr&) = delete;
  QuietStderr& operator=(const QuietStderr&) = delete;

 private:
  int saved_ = -1;
};

Result<cv::Mat> read_rgb(const std::string& path) {
  cv::Mat bgr;
  try {
    QuietStderr quiet;
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
  auto lat = (*file)->find("latent") ? (*file)->tensor("latent") : latent_file_images(**file);
  if (!lat.ok()) return fail(lat.status());
  const auto& meta = (*file)->metadata();
  auto space = meta.find("latent_space");
  if (space != meta.end() && space->second != m.latent_space().name)
    return fail(Status::errorf("latents in '", in, "' are in latent space '", space->second,
                               "' but the model's is '", m.latent_space().name, "'"));
  if (lat->rank() != 4 || lat->dim(1) != m.latent_space().channels)
    return fail(Status::errorf("tensor 'latent' in '", in, "' has shape ", latent::shape_str(lat->shape()),
                               ", expected [N, ", m.latent_space().channels, ", h, w]"));
  if (lat->dim(0) != 1)
    return fail(Status::errorf(
        "'", in, "' holds ", lat->dim(0), " latents ", latent::shape_str(lat->shape()),
        " and decode writes one image; decode a file of several frames with "
        "`latentsrc location=FILE ! vaedecode` (pipelines/decode_latents.sh)"));
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
  // Options of the other kind of part would be ignored: refuse them.
  if (part == "transformer" && a.options.count("graph"))
    return fail(Status::error("run: --graph applies to --part encoder or decoder"));
  if (part != "transformer" && a.options.count("case"))
    return fail(Status::error("run: --case applies to --part transformer"));
  if (part == "transformer") return cmd_run_transformer(a.options, a.positional);
  if (part != "encoder" && part != "decoder")
    return fail(Status::error("run needs --part encoder, decoder or transformer"));
  if (a.options.count("lora") || a.options.count("lora-mode"))
    return fail(Status::errorf("run --part ", part, ": --lora applies to the transformer only"));
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
  // Memory (CUDA): `base` in use before anything runs (weights and the input); `peak` the most
  // in use at once from there, planning included (the pool's mark plus the graphs' own, so an
  // upper bound); `steady` the most in use during the timed runs (PyTorch's max_memory_allocated
  // after warm-up counts the same way); `held` reserved from the driver after them.
  const int64_t base_bytes = b.memory_use().in_use;
  int64_t plan_peak_bytes = -1;
  // plans: a plan for this shape (warm-up + graph capture), built before the timed runs.
  const bool graph = a.get("graph", b.supports_capture() ? "1" : "0") != "0";
  std::unique_ptr<latent::PlannedPart> plan;
  if (graph) {
    auto t0 = std::chrono::steady_clock::now();
    latent::PlanOptions po;
    po.graph = true;
    po.adopt_input = true;  // x (uploaded once) is the graph's input: no second input buffer
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
    if (i == warmup) {
      // Planning and warm-up are over: the steady peak starts from here.
      plan_peak_bytes = b.peak_memory_bytes();
      b.reset_peak_memory();
    }
    auto t0 = std::chrono::steady_clock::now();
    auto r = plan ? plan->run(*x) : enc ? m.encode(*x) : m.decode(*x);
    if (!r.ok()) return fail(r.status());
    Status s = b.synchronize();
    if (!s.ok()) return fail(s);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) times.push_back(ms);
    y = std::move(r).value();
  }
  const int64_t steady_bytes = b.peak_memory_bytes();
  const int64_t held_bytes = b.memory_use().held;
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
    std::printf(
        "{\"part\": \"%s\", \"median_ms\": %.4f, \"min_ms\": %.4f, \"runs\": %d, "
        "\"peak_bytes\": %lld, \"steady_peak_bytes\": %lld, \"base_bytes\": %lld, "
        "\"held_bytes\": %lld, \"device\": \"%s\", \"dtype\": \"%s\", \"graph\": %s}\n",
        part.c_str(), median(times), *std::min_element(times.begin(), times.end()), repeat,
        static_cast<long long>(
            plan_peak_bytes < 0 || steady_bytes < 0 ? -1 : std::max(plan_peak_bytes, steady_bytes)),
        static_cast<long long>(steady_bytes), static_cast<long long>(base_bytes),
        static_cast<long long>(held_bytes), b.name().c_str(), latent::dtype_name(b.compute_dtype()),
        plan && plan->uses_graph() ? "true" : "false");
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
  // PSNR over all channels; identical images have no error: +inf (cv::PSNR would clamp the
  // error to print 361.20 dB).
  const double sq = cv::norm(*x, *y, cv::NORM_L2SQR);
  const double mse = sq / (static_cast<double>(x->total()) * x->channels());
  const double psnr = mse > 0 ? 10.0 * std::log10(255.0 * 255.0 / mse) : HUGE_VAL;
  cv::Mat xf, yf;
  x->convertTo(xf, CV_64F);
  y->convertTo(yf, CV_64F);
  std::vector<cv::Mat> xc, yc;
  cv::split(xf, xc);
  cv::split(yf, yc);
  double ssim = 0;
  for (int c = 0; c < 3; ++c) ssim += ssim_channel(xc[c], yc[c]) / 3;
  if (std::isinf(psnr))
    std::printf("PSNR inf dB  SSIM %.4f\n", ssim);
  else
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


// ---- The command line ------------------------------------------------------------------------

// One subcommand's options, kept as text in Args::options under their long name (without
// "--"): CLI11 checks the names, that each option has its value (an option's value never
// swallows the next option), its type and range; the commands read them as before.
class CommandOptions {
 public:
  // CLI11 takes the next argument as an option's value whatever it is: `--dtype --input x`
  // would read "--input" as the dtype. A value that is an option is a missing value.
  static CLI::Validator not_an_option() {
    return CLI::Validator(
        [](std::string& v) {
          return v.rfind("--", 0) == 0 ? "needs a value, but the next argument is the option " + v
                                       : std::string();
        },
        "");
  }

  CommandOptions(CLI::App* app, Args* args) : app_(app), args_(args) {}
  // --key VALUE
  CLI::Option* text(const std::string& key, const std::string& help) {
    CLI::Option* o = app_->add_option("--" + key, values_[key], help)->check(not_an_option());
    options_.emplace_back(key, o);
    return o;
  }
  // --key N, an integer in [lo, hi]
  CLI::Option* integer(const std::string& key, const std::string& help, int64_t lo, int64_t hi) {
    return text(key, help)->check(CLI::Range(lo, hi))->type_name("INT");
  }
  // --key X, a finite number
  CLI::Option* number(const std::string& key, const std::string& help) {
    return text(key, help)->check(CLI::Number)->type_name("FLOAT");
  }
  // --key VALUE, one of `choices`
  CLI::Option* choice(const std::string& key, const std::string& help,
                      const std::vector<std::string>& choices) {
    return text(key, help)->check(CLI::IsMember(choices));
  }
  // --key VALUE, repeatable: the values in order, newline-joined in Args::options
  CLI::Option* list(const std::string& key, const std::string& help) {
    CLI::Option* o = app_->add_option("--" + key, lists_[key], help)->check(not_an_option());
    o->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->allow_extra_args(false);
    options_.emplace_back(key, o);
    return o;
  }
  // --key (no value)
  CLI::Option* flag(const std::string& key, const std::string& help) {
    CLI::Option* o = app_->add_flag("--" + key, help);
    options_.emplace_back(key, o);
    flags_.insert(key);
    return o;
  }
  // What was given, into `args` (once CLI11 has parsed this subcommand).
  void collect() const {
    args_->command = app_->get_name();
    for (const auto& [key, o] : options_)
      if (o->count() > 0) {
        if (flags_.count(key)) {
          args_->options[key] = "1";
        } else if (lists_.count(key)) {
          std::string joined;
          for (const std::string& v : lists_.at(key)) joined += (joined.empty() ? "" : "\n") + v;
          args_->options[key] = joined;
        } else {
          args_->options[key] = values_.at(key);
        }
      }
  }

 private:
  CLI::App* app_;
  Args* args_;
  std::map<std::string, std::string> values_;  // node-based: the references CLI11 holds stay valid
  std::map<std::string, std::vector<std::string>> lists_;
  std::vector<std::pair<std::string, CLI::Option*>> options_;
  std::set<std::string> flags_;
};

const char* kModelHelp =
    "diffusers folder, pipeline root (its vae/; model_index.json optional), or single "
    ".safetensors file; omitted: the built-in default model";

struct Cli {
  CLI::App app{"latent-tool: inspect models and run their parts outside GStreamer", "latent-tool"};
  std::list<CommandOptions> commands;
  std::vector<std::string> positional;
};

// The options every command takes.
void add_common(CommandOptions& c) {
  c.text("device", "auto (first GPU, else the CPU), cpu, cuda, cuda:N (default auto)");
  c.choice("dtype",
           "compute dtype (default: fp32 on the CPU, bf16 on CUDA); fp8: the transformer's "
           "linear layers in FP8 e4m3, the rest as the default (transformer runs, denoise)",
           {"fp32", "bf16", "fp16", "fp8"});
  c.flag("verbose", "engine log to stderr");
}

// The lines of dit_usage() about `command` ("run" or "denoise").
std::string dit_usage_part(const std::string& command) {
  const std::string all = dit_usage();
  const size_t denoise = all.find("  denoise ");
  if (denoise == std::string::npos) return all;
  return command == "denoise" ? all.substr(denoise) : all.substr(0, denoise);
}

void make_cli(Cli& cli, Args& args) {
  CLI::App& app = cli.app;
  app.require_subcommand(1);
  app.footer(std::string("MODEL: ") + kModelHelp +
             ".\nlatent-tool COMMAND --help describes each command.");
  auto add = [&](const char* name, const char* help, bool on_a_backend = true) {
    CLI::App* sub = app.add_subcommand(name, help);
    cli.commands.emplace_back(sub, &args);
    CommandOptions& c = cli.commands.back();
    if (on_a_backend) {
      add_common(c);
    } else {
      c.flag("verbose", "engine log to stderr");
    }
    sub->final_callback([&c] { c.collect(); });
    return std::make_pair(sub, &c);
  };

  {
    auto [sub, c] = add("inspect",
                        "architecture, parts, parameters and latent space of a model; what a "
                        "latent file or a LoRA file is");
    c->text("model", kModelHelp);
    sub->add_option("MODEL", cli.positional, kModelHelp)->expected(0, 1);
  }
  {
    auto [sub, c] = add("encode", "image -> normalised latents (+ frame size) in a safetensors file");
    c->text("model", kModelHelp);
    c->text("input", "image to encode")->required();
    c->text("output", "latents file (.safetensors) to write")->required();
    (void)sub;
  }
  {
    auto [sub, c] = add("decode", "latents file (from encode) -> image");
    c->text("model", kModelHelp);
    c->text("input", "latents file (.safetensors, tensor 'latent')")->required();
    c->text("output", "image to write")->required();
    (void)sub;
  }
  {
    auto [sub, c] = add("run", "one model part on raw tensors, timed");
    c->text("model", kModelHelp);
    c->choice("part", "encoder, decoder or transformer", {"encoder", "decoder", "transformer"})
        ->required();
    c->text("inputs", "input tensors (.safetensors)")->required();
    c->text("outputs", "output tensors (.safetensors) to write")->required();
    c->text("case", "transformer: read the inputs NAME.<tensor>");
    c->list("lora", "transformer: a LoRA FILE[:STRENGTH] (repeatable; they stack)");
    c->choice("lora-mode", "transformer LoRAs merged into the weights (default) or at run time",
              {"merged", "runtime"});
    c->integer("warmup", "untimed runs first (default 1)", 0, 1000);
    c->integer("repeat", "timed runs (default 1)", 1, 100000);
    c->choice("graph", "VAE parts: plan the part and replay it as a CUDA graph (default 1 on CUDA)",
              {"0", "1"});
    c->flag("json", "also print one JSON line of timings");
    c->integer("chunk", "video models: frames (encoder) or latent frames (decoder) per push; 0: the whole clip",
               0, 1 << 30);
    c->integer("stream-repeat", "video models: push the clip K times into one stream", 1, 1 << 20);
    sub->footer(
        "encoder: `sample` [N,3,H,W] in [-1,1] -> `latent_mean` (TAESD family: `latents`)\n"
        "decoder: `latent` (un-normalised) -> `sample` in [-1,1]\n"
        "video models (5-D): `sample` [N,3,T,H,W] -> `latent_mean` [N,C,1+ceil((T-1)/4),h,w];\n"
        "`latent` [N,C,t,h,w] -> `sample` [N,3,1+4(t-1),H,W]\n" +
        dit_usage_part("run"));
  }
  {
    auto [sub, c] = add("denoise", "the Qwen-Image denoising loop (text-to-image, img2img, edit)");
    c->text("model", "Qwen-Image pipeline root (transformer/, scheduler/, vae/)")->required();
    c->text("embeds", "prompt embeddings (.safetensors from tools/compute_prompt_embeds.py)");
    c->integer("steps", "steps of the schedule (default 50)", 1, 10000);
    c->number("true-cfg-scale", "true classifier-free guidance scale (default 4)");
    c->integer("seed", "noise seed (default 0)", 0, INT64_MAX);
    c->integer("width", "target width in pixels (a multiple of 16)", 0, 1 << 16);
    c->integer("height", "target height in pixels (a multiple of 16)", 0, 1 << 16);
    c->text("noise", "initial noise, a latents file");
    c->text("init", "img2img: initial latents file");
    c->number("strength", "img2img strength (default 1)");
    c->text("reference", "edit: reference latents files, comma-separated");
    c->choice("batch-cfg", "run the CFG pair as one batch (default 1)", {"0", "1"});
    c->text("output-latents", "latents file to write");
    c->text("output", "image to write (decoded with the VAE)");
    c->text("output-sample", "decoded image tensor (.safetensors) to write");
    c->text("transformer", "transformer folder (default: ROOT's transformer/)");
    c->text("vae", "VAE (default: ROOT's vae/)");
    c->text("scheduler", "scheduler_config.json (default: ROOT's scheduler/)");
    c->text("inputs", "every input from one file of NAME.<tensor> entries (with --case)");
    c->text("case", "the NAME of --inputs");
    c->list("lora", "transformer: a LoRA FILE[:STRENGTH] (repeatable; they stack)");
    c->choice("lora-mode", "transformer LoRAs merged into the weights (default) or at run time",
              {"merged", "runtime"});
    sub->footer(dit_usage_part("denoise"));
  }
  {
    auto [sub, c] = add("stream", "vaeencode ! vaedecode's engine loop on host frames, timed");
    c->text("model", kModelHelp);
    c->text("size", "frame size WxH (default 1920x1080)");
    c->text("format", "frame format (default RGBx)");
    c->integer("frames", "frames a mode (default 100)", 1, 1000000);
    c->integer("prefetch-depth", "staging depth (default 2)", 0, 64);
    c->integer("warmup", "untimed frames first (default 3)", 0, 1000000);
    c->choice("graph", "replay the planned parts as CUDA graphs (default 1)", {"0", "1"});
    c->flag("json", "also print one JSON line");
    sub->footer(stream_usage());
  }
  {
    // No model and no backend: --device / --dtype would be ignored, so they are refused.
    auto [sub, c] = add("compare", "PSNR (dB; inf for identical images) and SSIM of two images",
                        false);
    sub->add_option("IMAGES", cli.positional, "two images of one size")->expected(2)->required();
    (void)c;
  }
}

}  // namespace

int main(int argc, char** argv) {
#if LATENT_TOOL_OPENCV
  // Our own messages name the file and the problem; OpenCV's warnings would only repeat them.
  cv::utils::logging::setLogLevel(cv::utils::logging::LOG_LEVEL_SILENT);
#endif
  Args args;
  Cli cli;
  make_cli(cli, args);
  // `latent-tool help` (used by bench/bench_pipelines.py) is `latent-tool --help`.
  if (argc == 2 && std::strcmp(argv[1], "help") == 0) {
    std::printf("%s", cli.app.help().c_str());
    return 0;
  }
  try {
    cli.app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return cli.app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return cli.app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "latent-tool: error: %s\nRun with --help for more information.\n",
                 e.what());
    return 2;
  }
  args.positional = cli.positional;
  const Args& a = args;
  if (a.options.count("verbose")) latent::set_log_callback(log_to_stderr, nullptr);
  if (Status s = check_outputs(a); !s.ok()) return fail(s);
  if (a.command == "inspect") return cmd_inspect(a);
  if (a.command == "encode") return cmd_encode(a);
  if (a.command == "decode") return cmd_decode(a);
  if (a.command == "run") return cmd_run(a);
  if (a.command == "denoise") return cmd_denoise(a.options, a.positional);
  if (a.command == "stream") return cmd_stream(a.options);
  if (a.command == "compare") return cmd_compare(a);
  std::fprintf(stderr, "latent-tool: error: unknown command '%s'\n", a.command.c_str());
  return 2;
}
