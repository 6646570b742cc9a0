// Video mode of the Wan 2.1 / Qwen-Image VAE (VaeStream, encode_video, decode_video) against
// diffusers fixtures made by scripts/make_video_fixtures.py: wan_vae_video_tiny (an
// AutoencoderKLWan folder with decoder_base_dim), wan_vae_video_tiny_single (the same weights as
// an original Wan 2.1 single file) and qwen_image_vae_video_tiny (AutoencoderKLQwenImage with its
// temporal resamplers in the first levels). Also: streaming in any chunking equals the whole
// clip, and a stream's memory does not grow with the clip's length.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/core/log.h"
#include "engine/models/vae/vae.h"
#include "tests/util/test_util.h"
#include "tests/util/vae_test_util.h"

namespace latent {
namespace {

constexpr double kTolerance = 1e-3;  // fp32 CPU against diffusers fp32
// Streaming against the whole clip in the engine itself: the same ops on the same frames, so
// only the order of summation inside the ops may differ.
constexpr double kSameTolerance = 1e-5;

const char* const kCases[] = {"wan_vae_video_tiny", "wan_vae_video_tiny_single",
                              "qwen_image_vae_video_tiny"};

std::string model_path(const std::string& name) {
  const std::string dir = test::fixture(name);
  return name.find("_single") != std::string::npos ? dir + "/vae_single.safetensors" : dir;
}

std::map<std::string, Tensor> io(const std::string& name) {
  // wan22_vae_video_tiny_single has the folder case's weights and shares its io file.
  const std::string folder = name == "wan22_vae_video_tiny_single" ? "wan22_vae_video_tiny" : name;
  return test::read_all(test::fixture(folder) + "/io.safetensors");
}

Tensor up(Backend& b, const Tensor& host) {
  auto t = b.upload(host.to_dtype(DType::kF32));
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : Tensor();
}

Tensor down(Backend& b, const Result<Tensor>& t) {
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok() || !t->defined()) return Tensor();
  auto h = b.download(*t);
  EXPECT_TRUE(h.ok()) << h.status().message();
  return h.ok() ? *h : Tensor();
}

void expect_close(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(shape_str(got.shape()), shape_str(ref.shape())) << what;
  const double err = relative_l2(got, ref);
  EXPECT_LT(err, tol) << what << ": relative L2 " << err;
}

// Frames [start, start + count) of a host clip [N, C, T, H, W].
Tensor host_frames(const Tensor& clip, int64_t start, int64_t count) {
  const int64_t n = clip.dim(0), c = clip.dim(1), t = clip.dim(2);
  const int64_t hw = clip.dim(3) * clip.dim(4);
  Tensor out = Tensor::empty({n, c, count, clip.dim(3), clip.dim(4)}, DType::kF32);
  const std::vector<float> src = clip.to_floats();
  float* dst = out.data_as<float>();
  for (int64_t i = 0; i < n * c; ++i)
    for (int64_t f = 0; f < count; ++f)
      std::copy(src.begin() + (i * t + start + f) * hw, src.begin() + (i * t + start + f + 1) * hw,
                dst + (i * count + f) * hw);
  return out;
}

// The host clips of `parts` joined along time.
Tensor host_join(const std::vector<Tensor>& parts) {
  int64_t total = 0;
  for (const Tensor& p : parts) total += p.dim(2);
  const Tensor& a = parts[0];
  const int64_t nc = a.dim(0) * a.dim(1), hw = a.dim(3) * a.dim(4);
  Tensor out = Tensor::empty({a.dim(0), a.dim(1), total, a.dim(3), a.dim(4)}, DType::kF32);
  float* dst = out.data_as<float>();
  int64_t at = 0;
  for (const Tensor& p : parts) {
    const std::vector<float> src = p.to_floats();
    for (int64_t i = 0; i < nc; ++i)
      std::copy(src.begin() + i * p.dim(2) * hw, src.begin() + (i + 1) * p.dim(2) * hw,
                dst + (i * total + at) * hw);
    at += p.dim(2);
  }
  return out;
}

// Pushes `clip` through a new stream in chunks of the given sizes (cycled), then finish().
Tensor stream_in_chunks(VaeModel& vae, bool encoder, const Tensor& clip,
                        const std::vector<int>& sizes, int* padded = nullptr) {
  Backend& b = vae.backend();
  auto stream = vae.open_stream(encoder);
  EXPECT_TRUE(stream.ok()) << stream.status().message();
  if (!stream.ok()) return Tensor();
  std::vector<Tensor> outs;
  int64_t at = 0;
  for (size_t i = 0; at < clip.dim(2); ++i) {
    const int64_t n = std::min<int64_t>(sizes[i % sizes.size()], clip.dim(2) - at);
    Tensor y = down(b, (*stream)->push(up(b, host_frames(clip, at, n))));
    if (y.defined()) outs.push_back(y);
    at += n;
    EXPECT_EQ((*stream)->frames_seen(), at);
  }
  Tensor tail = down(b, (*stream)->finish(padded));
  if (tail.defined()) outs.push_back(tail);
  EXPECT_EQ((*stream)->frames_seen(), 0) << "finish() resets the stream";
  return outs.empty() ? Tensor() : host_join(outs);
}

// Whole clips through encode_video / decode_video against diffusers' outputs in the fixture:
// 9 frames, 3 latent frames, and 7 frames (finish() pads with the last frame to 9, as diffusers
// on the padded clip).
void expect_clips_match_diffusers(VaeModel& vae, std::map<std::string, Tensor>& t) {
  Backend& b = vae.backend();
  expect_close(down(b, vae.encode_video(up(b, t["sample"]))), t["latent_mean"], kTolerance,
               "encode_video");
  expect_close(down(b, vae.decode_video(up(b, t["latent"]))), t["decoded"], kTolerance,
               "decode_video");
  expect_close(down(b, vae.encode_video(up(b, t["sample_odd"]))), t["latent_mean_odd"], kTolerance,
               "encode_video of 7 frames");
}

class WanVideo : public ::testing::TestWithParam<const char*> {};

TEST_P(WanVideo, MatchesDiffusers) {
  auto vae = test::load_ok(model_path(GetParam()));
  ASSERT_TRUE(vae);
  auto t = io(GetParam());
  EXPECT_EQ(vae->temporal_factor(), 4);
  EXPECT_TRUE(vae->supports_video());
  expect_clips_match_diffusers(*vae, t);
}

TEST_P(WanVideo, StreamingInAnyChunkingEqualsWholeClip) {
  auto vae = test::load_ok(model_path(GetParam()));
  ASSERT_TRUE(vae);
  auto t = io(GetParam());
  for (const std::vector<int>& sizes :
       std::vector<std::vector<int>>{{1}, {2}, {3}, {5, 1, 3}, {9}, {4, 4, 1}}) {
    std::string what = "encoder chunks of";
    for (int s : sizes) what += " " + std::to_string(s);
    expect_close(stream_in_chunks(*vae, true, t["sample"], sizes), t["latent_mean"], kTolerance,
                 what);
    int padded = -1;
    expect_close(stream_in_chunks(*vae, true, t["sample_odd"], sizes, &padded),
                 t["latent_mean_odd"], kTolerance, what + " (7 frames)");
    EXPECT_EQ(padded, 2) << what;
  }
  Backend& b = vae->backend();
  const Tensor whole = down(b, vae->decode_video(up(b, t["latent"])));
  for (const std::vector<int>& sizes : std::vector<std::vector<int>>{{1}, {2, 1}, {1, 2}}) {
    expect_close(stream_in_chunks(*vae, false, t["latent"], sizes), whole, kSameTolerance,
                 "decoder chunks");
  }
  // Encoder chunks against the whole clip in the engine itself, tightly.
  const Tensor whole_enc = down(b, vae->encode_video(up(b, t["sample"])));
  expect_close(stream_in_chunks(*vae, true, t["sample"], {1}), whole_enc, kSameTolerance,
               "encoder frame by frame vs whole clip");
}

// The models' fused path (Backend::conv3d_frames, what CUDA runs through cuDNN's 3-D
// convolution): a CPU backend made with LATENT_CPU_CONV3D=1 offers the op (as one conv2d per
// tap over the merged kernel), so the merged weight layout and its use are checked here too.
// The layers that see one frame at a time keep their input frames in a frame ring there
// (CausalConv::ring_w, LATENT_VIDEO_RING): the debug log says when a ring starts.
TEST_P(WanVideo, FusedConv3dPathMatchesDiffusers) {
  setenv("LATENT_CPU_CONV3D", "1", 1);
  auto backend = create_cpu_backend(DType::kF32);
  unsetenv("LATENT_CPU_CONV3D");
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  ASSERT_TRUE((*backend)->supports_conv3d_frames());
  auto vae = load_vae(model_path(GetParam()), *backend);
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  auto t = io(GetParam());
  Backend& b = **backend;
  static int rings = 0, normed = 0;
  rings = 0;
  normed = 0;
  set_log_callback(
      [](LogLevel, const char*, int, const char* message, void*) {
        const std::string m(message);
        if (m.find("a frame ring of") != std::string::npos) ++rings;
        // a residual block's conv1 -> norm2 -> SiLU through Backend::conv3d_frames_normed (the
        // ring's later frames), here composed by the CPU backend
        if (m.find("conv3d_frames_normed:") != std::string::npos) ++normed;
      },
      nullptr);  // a callback sees every level
  expect_close(down(b, (*vae)->encode_video(up(b, t["sample"]))), t["latent_mean"], kTolerance,
               "encode_video (fused)");
  const int encoder_rings = rings;
  expect_close(down(b, (*vae)->decode_video(up(b, t["latent"]))), t["decoded"], kTolerance,
               "decode_video (fused)");
  const int decoder_rings = rings - encoder_rings;
  set_log_callback(nullptr, nullptr);
  // ctest runs these once more with LATENT_VIDEO_RING=0 (test_wan_vae_video_no_ring): no rings.
  const char* ring_env = std::getenv("LATENT_VIDEO_RING");
  const bool ring_on = !ring_env || std::string(ring_env) != "0";
  EXPECT_EQ(encoder_rings > 0, ring_on) << encoder_rings << " rings in the encoder";
  EXPECT_EQ(decoder_rings > 0, ring_on) << decoder_rings << " rings in the decoder";
  EXPECT_EQ(normed > 0, ring_on) << normed << " convolutions with the norm after them";
  expect_close(stream_in_chunks(**vae, true, t["sample_odd"], {2, 3}), t["latent_mean_odd"],
               kTolerance, "encoder chunks of 2, 3 (fused)");
  // image mode still runs on the last tap
  auto frame0 = host_frames(t["sample"], 0, 1).reshape({1, 3, 24, 40});
  ASSERT_TRUE(frame0.ok());
  auto lat0 = host_frames(t["latent_mean"], 0, 1).reshape({1, 16, 3, 5});
  ASSERT_TRUE(lat0.ok());
  expect_close(down(b, (*vae)->encode(up(b, *frame0))), *lat0, kTolerance, "encode(frame 0)");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, WanVideo, ::testing::ValuesIn(kCases));

TEST(WanVideoStream, BufferingCountsAndPadding) {
  auto vae = test::load_ok(model_path("wan_vae_video_tiny"));
  ASSERT_TRUE(vae);
  Backend& b = vae->backend();
  auto t = io("wan_vae_video_tiny");
  auto stream = vae->open_stream(true);
  ASSERT_TRUE(stream.ok()) << stream.status().message();
  VaeStream& s = **stream;
  // Frame 0 alone makes latent frame 0 at once.
  auto y = s.push(up(b, host_frames(t["sample"], 0, 1)));
  ASSERT_TRUE(y.ok()) << y.status().message();
  ASSERT_TRUE(y->defined());
  EXPECT_EQ(shape_str(y->shape()), "[1, 16, 1, 3, 5]");
  EXPECT_EQ(s.frames_buffered(), 0);
  // Three more frames wait for the fourth.
  y = s.push(up(b, host_frames(t["sample"], 1, 3)));
  ASSERT_TRUE(y.ok()) << y.status().message();
  EXPECT_FALSE(y->defined());
  EXPECT_EQ(s.frames_buffered(), 3);
  EXPECT_EQ(s.frames_seen(), 4);
  y = s.push(up(b, host_frames(t["sample"], 4, 1)));
  ASSERT_TRUE(y.ok());
  ASSERT_TRUE(y->defined());
  EXPECT_EQ(shape_str(y->shape()), "[1, 16, 1, 3, 5]");
  EXPECT_EQ(s.frames_buffered(), 0);
  // Nothing buffered: finish() returns nothing and pads nothing.
  int padded = -1;
  auto tail = s.finish(&padded);
  ASSERT_TRUE(tail.ok());
  EXPECT_FALSE(tail->defined());
  EXPECT_EQ(padded, 0);

  // reset() drops the caches: the next clip equals a fresh stream's.
  ASSERT_TRUE(s.push(up(b, host_frames(t["sample"], 0, 6))).ok());
  s.reset();
  EXPECT_EQ(s.frames_buffered(), 0);
  EXPECT_EQ(s.frames_seen(), 0);
  std::vector<Tensor> outs;
  for (int64_t at = 0; at < 9; at += 3) {
    Tensor o = down(b, s.push(up(b, host_frames(t["sample"], at, 3))));
    if (o.defined()) outs.push_back(o);
  }
  expect_close(host_join(outs), t["latent_mean"], kTolerance, "after reset()");

  // The decoder: 1 frame for latent frame 0, then 4 a latent frame.
  auto dec = vae->open_stream(false);
  ASSERT_TRUE(dec.ok());
  auto frames = (*dec)->push(up(b, host_frames(t["latent"], 0, 1)));
  ASSERT_TRUE(frames.ok());
  EXPECT_EQ(shape_str(frames->shape()), "[1, 3, 1, 24, 40]");
  frames = (*dec)->push(up(b, host_frames(t["latent"], 1, 2)));
  ASSERT_TRUE(frames.ok());
  EXPECT_EQ(shape_str(frames->shape()), "[1, 3, 8, 24, 40]");
  EXPECT_EQ((*dec)->frames_seen(), 3);
  EXPECT_EQ((*dec)->frames_buffered(), 0);
}

TEST(WanVideoStream, BatchOfTwoClipsMatchesEachClip) {
  auto vae = test::load_ok(model_path("qwen_image_vae_video_tiny"));
  ASSERT_TRUE(vae);
  Backend& b = vae->backend();
  auto t = io("qwen_image_vae_video_tiny");
  // [2, 3, 9, H, W]: the fixture clip and the 7-frame clip padded by hand to 9 frames.
  const Tensor odd = t["sample_odd"];
  const Tensor padded = host_join({odd, host_frames(odd, 6, 1), host_frames(odd, 6, 1)});
  const Tensor a = t["sample"];
  Tensor both = Tensor::empty({2, 3, 9, 24, 40}, DType::kF32);
  std::copy(a.data_as<float>(), a.data_as<float>() + a.numel(), both.data_as<float>());
  std::copy(padded.data_as<float>(), padded.data_as<float>() + padded.numel(),
            both.data_as<float>() + a.numel());
  const Tensor got = down(b, vae->encode_video(up(b, both)));
  ASSERT_TRUE(got.defined());
  ASSERT_EQ(shape_str(got.shape()), "[2, 16, 3, 3, 5]");
  const std::vector<float> g = got.to_floats();
  const int64_t half = got.numel() / 2;
  expect_close(Tensor::from_floats({1, 16, 3, 3, 5}, {g.begin(), g.begin() + half}),
               t["latent_mean"], kTolerance, "clip 0 of 2");
  expect_close(Tensor::from_floats({1, 16, 3, 3, 5}, {g.begin() + half, g.end()}),
               t["latent_mean_odd"], kTolerance, "clip 1 of 2");
}

// Live heap bytes (glibc): what the process holds now, mmapped blocks included.
size_t live_heap_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

TEST(WanVideoStream, MemoryDoesNotGrowWithClipLength) {
  auto vae = test::load_ok(model_path("wan_vae_video_tiny"));
  ASSERT_TRUE(vae);
  Backend& b = vae->backend();
  // 50 then 500 frames of 16x16 through each stream (the encoder fed 7 frames a push, so frames
  // wait in its buffer; the decoder one latent frame, 4 frames, a push). Holding the 450 extra
  // frames alone would take over 1 MiB, and every layer's activations many times that.
  const Tensor frames = test::random_tensor({1, 3, 7, 16, 16}, 7);
  const Tensor latent = test::random_tensor({1, 16, 1, 2, 2}, 8);
  for (bool encoder : {true, false}) {
    auto stream = vae->open_stream(encoder);
    ASSERT_TRUE(stream.ok()) << stream.status().message();
    const Tensor in = up(b, encoder ? frames : latent);
    int64_t done = 0;  // input frames (encoder) or output frames (decoder)
    auto run_to = [&](int64_t n) {
      while (done < n) {
        auto y = (*stream)->push(in);
        ASSERT_TRUE(y.ok()) << y.status().message();
        done += encoder ? 7 : (y->defined() ? y->dim(2) : 0);
      }
    };
    run_to(50);
    malloc_trim(0);
    const size_t after_50 = live_heap_bytes();
    run_to(500);
    malloc_trim(0);
    const size_t after_500 = live_heap_bytes();
    const double grown = static_cast<double>(after_500) - static_cast<double>(after_50);
    EXPECT_LT(grown, 128 * 1024.0)
        << (encoder ? "encoder" : "decoder") << " stream: live heap " << after_50
        << " bytes after 50 frames, " << after_500 << " after 500";
  }
}

TEST(WanVideoStream, BadInputsAreNamed) {
  auto vae = test::load_ok(model_path("wan_vae_video_tiny"));
  ASSERT_TRUE(vae);
  Backend& b = vae->backend();
  auto enc = vae->open_stream(true);
  ASSERT_TRUE(enc.ok());
  auto msg = [](const Result<Tensor>& r) {
    return r.ok() ? std::string("ok") : r.status().message();
  };
  // 4-D and wrong channel counts
  std::string m = msg((*enc)->push(up(b, test::random_tensor({1, 3, 24, 40}, 1))));
  EXPECT_NE(m.find("[N, 3, T, H, W]"), std::string::npos) << m;
  m = msg((*enc)->push(up(b, test::random_tensor({1, 4, 1, 24, 40}, 1))));
  EXPECT_NE(m.find("[1, 4, 1, 24, 40]"), std::string::npos) << m;
  m = msg((*enc)->push(up(b, test::random_tensor({1, 3, 1, 20, 40}, 1))));
  EXPECT_NE(m.find("not a multiple of 8"), std::string::npos) << m;
  // A different frame size in the middle of a clip
  ASSERT_TRUE((*enc)->push(up(b, test::random_tensor({1, 3, 1, 24, 40}, 1))).ok());
  m = msg((*enc)->push(up(b, test::random_tensor({1, 3, 1, 32, 40}, 1))));
  EXPECT_NE(m.find("the clip began with [1, 3, 1, 24, 40]"), std::string::npos) << m;
  EXPECT_FALSE(vae->encode_video(up(b, test::random_tensor({1, 3, 24, 40}, 1))).ok());

  auto dec = vae->open_stream(false);
  ASSERT_TRUE(dec.ok());
  m = msg((*dec)->push(up(b, test::random_tensor({1, 4, 1, 3, 5}, 1))));
  EXPECT_NE(m.find("[N, 16, T, H, W]"), std::string::npos) << m;

  // A model loaded without its decoder has no decoder stream.
  VaeLoadOptions enc_only;
  enc_only.decoder = false;
  auto half = test::load_ok(model_path("wan_vae_video_tiny"), enc_only);
  ASSERT_TRUE(half);
  auto no = half->open_stream(false);
  ASSERT_FALSE(no.ok());
  EXPECT_NE(no.status().message().find("without its decoder"), std::string::npos)
      << no.status().message();
}

TEST(WanVideoStream, ImageModelsHaveNoVideoMode) {
  auto kl = test::load_ok(test::fixture("kl_tiny"));
  ASSERT_TRUE(kl);
  EXPECT_EQ(kl->temporal_factor(), 1);
  auto s = kl->open_stream(true);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("no video mode"), std::string::npos) << s.status().message();
}

TEST(WanVideoStream, InfoSaysVideo) {
  for (const char* name : kCases) {
    auto vae = test::load_ok(model_path(name));
    ASSERT_TRUE(vae);
    EXPECT_NE(vae->info().description.find("video: temporal factor 4"), std::string::npos)
        << vae->info().description;
  }
  auto wan = test::load_ok(model_path("wan_vae_video_tiny"));
  EXPECT_EQ(wan->info().architecture, "AutoencoderKLWan");
  // decoder_base_dim read back from the single file's shapes
  auto single = test::load_ok(model_path("wan_vae_video_tiny_single"));
  EXPECT_NE(single->info().description.find("decoder_base_dim: 3"), std::string::npos)
      << single->info().description;
}

TEST(WanVideoStream, ImageModeIsTheFirstFrame) {
  // encode() of frame 0 as an image equals latent frame 0 of the clip (frame 0 is encoded alone).
  auto vae = test::load_ok(model_path("wan_vae_video_tiny"));
  ASSERT_TRUE(vae);
  Backend& b = vae->backend();
  auto t = io("wan_vae_video_tiny");
  auto frame0 = host_frames(t["sample"], 0, 1).reshape({1, 3, 24, 40});
  ASSERT_TRUE(frame0.ok());
  const Tensor img = down(b, vae->encode(up(b, *frame0)));
  auto lat0 = host_frames(t["latent_mean"], 0, 1).reshape({1, 16, 3, 5});
  ASSERT_TRUE(lat0.ok());
  expect_close(img, *lat0, kTolerance, "encode(frame 0)");
}

// ---- Wan 2.2 (AutoencoderKLWan with is_residual, patch_size 2) -------------------------------
// wan22_vae_video_tiny: a diffusers folder; wan22_vae_video_tiny_single: the same weights under
// the original Wan 2.2 key names, no config (read back from the shapes). Clips of 9 frames of
// 32x32 -> 3 latent frames of 2x2 (16x).
const char* const kWan22Cases[] = {"wan22_vae_video_tiny", "wan22_vae_video_tiny_single"};

class Wan22Video : public ::testing::TestWithParam<const char*> {};

TEST_P(Wan22Video, MatchesDiffusers) {
  auto vae = test::load_ok(model_path(GetParam()));
  ASSERT_TRUE(vae);
  auto t = io(GetParam());
  EXPECT_EQ(vae->temporal_factor(), 4);
  EXPECT_EQ(vae->downsample(), 16);
  EXPECT_EQ(vae->latent_space().channels, 16);
  expect_clips_match_diffusers(*vae, t);
}

// (One case: both hold the same network.)
TEST(Wan22VideoStream, StreamingInOddChunksEqualsWholeClip) {
  auto vae = test::load_ok(model_path("wan22_vae_video_tiny"));
  ASSERT_TRUE(vae);
  auto t = io("wan22_vae_video_tiny");
  Backend& b = vae->backend();
  for (const std::vector<int>& sizes : std::vector<std::vector<int>>{{3}, {5, 1, 3}}) {
    std::string what = "encoder chunks of";
    for (int s : sizes) what += " " + std::to_string(s);
    expect_close(stream_in_chunks(*vae, true, t["sample"], sizes), t["latent_mean"], kTolerance,
                 what);
    int padded = -1;
    expect_close(stream_in_chunks(*vae, true, t["sample_odd"], sizes, &padded),
                 t["latent_mean_odd"], kTolerance, what + " (7 frames)");
    EXPECT_EQ(padded, 2) << what;
  }
  const Tensor whole = down(b, vae->decode_video(up(b, t["latent"])));
  for (const std::vector<int>& sizes : std::vector<std::vector<int>>{{1}, {2, 1}}) {
    expect_close(stream_in_chunks(*vae, false, t["latent"], sizes), whole, kSameTolerance,
                 "decoder chunks");
  }
}

// Image mode: a frame is a one-frame clip. diffusers encodes frame 0 alone and decodes latent
// frame 0 alone into frame 0, so those are the image results.
TEST_P(Wan22Video, ImageModeIsAOneFrameClip) {
  auto vae = test::load_ok(model_path(GetParam()));
  ASSERT_TRUE(vae);
  Backend& b = vae->backend();
  auto t = io(GetParam());
  auto frame0 = host_frames(t["sample"], 0, 1).reshape({1, 3, 32, 32});
  ASSERT_TRUE(frame0.ok());
  auto lat0 = host_frames(t["latent_mean"], 0, 1).reshape({1, 16, 2, 2});
  ASSERT_TRUE(lat0.ok());
  expect_close(down(b, vae->encode(up(b, *frame0))), *lat0, kTolerance, "encode(frame 0)");
  auto z0 = host_frames(t["latent"], 0, 1).reshape({1, 16, 2, 2});
  ASSERT_TRUE(z0.ok());
  auto dec0 = host_frames(t["decoded"], 0, 1).reshape({1, 3, 32, 32});
  ASSERT_TRUE(dec0.ok());
  expect_close(down(b, vae->decode(up(b, *z0))), *dec0, kTolerance, "decode(latent frame 0)");
}

// The fused conv3d_frames path (what CUDA runs) on the Wan 2.2 blocks.
TEST(Wan22VideoStream, FusedConv3dPathMatchesDiffusers) {
  setenv("LATENT_CPU_CONV3D", "1", 1);
  auto backend = create_cpu_backend(DType::kF32);
  unsetenv("LATENT_CPU_CONV3D");
  ASSERT_TRUE(backend.ok()) << backend.status().message();
  auto vae = load_vae(model_path("wan22_vae_video_tiny"), *backend);
  ASSERT_TRUE(vae.ok()) << vae.status().message();
  auto t = io("wan22_vae_video_tiny");
  Backend& b = **backend;
  expect_close(down(b, (*vae)->encode_video(up(b, t["sample"]))), t["latent_mean"], kTolerance,
               "encode_video (fused)");
  expect_close(down(b, (*vae)->decode_video(up(b, t["latent"]))), t["decoded"], kTolerance,
               "decode_video (fused)");
}

TEST(Wan22VideoStream, InfoSaysWan22) {
  for (const char* name : kWan22Cases) {
    auto vae = test::load_ok(model_path(name));
    ASSERT_TRUE(vae);
    const std::string& d = vae->info().description;
    EXPECT_NE(d.find("Wan 2.2 VAE"), std::string::npos) << d;
    EXPECT_NE(d.find("video: temporal factor 4"), std::string::npos) << d;
    EXPECT_NE(d.find("spatial downsample: 16"), std::string::npos) << d;
    EXPECT_NE(d.find("patch_size: 2"), std::string::npos) << d;
    EXPECT_NE(d.find("input_channels: 12"), std::string::npos) << d;
  }
  // decoder_base_dim read back from the single file's shapes
  auto single = test::load_ok(model_path("wan22_vae_video_tiny_single"));
  EXPECT_NE(single->info().description.find("decoder_base_dim: 2"), std::string::npos)
      << single->info().description;
  EXPECT_NE(single->info().description.find("Wan-Video / ComfyUI"), std::string::npos);
}

TEST(Wan22VideoStream, FrameSizeMustBeAMultipleOf16) {
  auto vae = test::load_ok(model_path("wan22_vae_video_tiny"));
  ASSERT_TRUE(vae);
  Backend& b = vae->backend();
  auto s = vae->encode_video(up(b, Tensor::zeros({1, 3, 1, 24, 32}, DType::kF32)));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("16"), std::string::npos) << s.status().message();
  auto c = vae->encode_video(up(b, Tensor::zeros({1, 12, 1, 32, 32}, DType::kF32)));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("[N, 3, T, H, W]"), std::string::npos)
      << c.status().message();
}

// A Wan 2.2 single file holding only the decoder (or only the encoder): the configuration is read
// from that part's shapes alone (the decoder gives base_dim as the gcd of its widths).
TEST(Wan22VideoStream, SinglePartFiles) {
  const auto all = test::read_all(model_path("wan22_vae_video_tiny_single"));
  auto t = io("wan22_vae_video_tiny");
  for (bool encoder : {true, false}) {
    std::map<std::string, Tensor> part;
    for (const auto& [name, tensor] : all) {
      const bool enc = name.rfind("encoder.", 0) == 0 || name.rfind("conv1.", 0) == 0;
      if (enc == encoder) part[name] = tensor;
    }
    const std::string path =
        test::temp_dir() + (encoder ? "/wan22_encoder.safetensors" : "/wan22_decoder.safetensors");
    test::write_all(path, part);
    VaeLoadOptions opts;
    opts.encoder = encoder;
    opts.decoder = !encoder;
    auto vae = test::load_ok(path, opts);
    ASSERT_TRUE(vae) << path;
    Backend& b = vae->backend();
    if (encoder) {
      expect_close(down(b, vae->encode_video(up(b, t["sample"]))), t["latent_mean"], kTolerance,
                   "encode_video (encoder-only file)");
    } else {
      expect_close(down(b, vae->decode_video(up(b, t["latent"]))), t["decoded"], kTolerance,
                   "decode_video (decoder-only file)");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Wan22Video, ::testing::ValuesIn(kWan22Cases));

}  // namespace
}  // namespace latent
